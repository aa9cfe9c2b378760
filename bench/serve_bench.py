"""HTTP cost and prefix reuse of `neagari serve`, against `neagari bench` on the same model.

    python3 bench/serve_bench.py --neagari target/release/neagari -m MODEL [-t 2] [-p 512] [-n 128] [-r 3]

1. `neagari bench -p P -n N` (prefill of P tokens, N decode steps), in-process.
2. The same through HTTP: POST /v1/completions with P prompt token ids, stream, ignore_eos,
   max_tokens N; time to first token (the prefill, plus the HTTP round trip) and decode
   tok/s between the first and last streamed token. The cache is cleared between runs by a
   different one-token request, so every run prefills all P tokens.
3. Prefix reuse: a chat with a long system prompt; time to first token of turn 1 (cold)
   and of turn 2 (the same conversation plus one reply and one question).

Standard library only (no SDK), so the client adds as little as possible.
"""

import argparse
import http.client
import json
import random
import socket
import statistics
import subprocess
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def stream(port, path, body):
    """POST and read the SSE stream (read raw: chunk-size lines are skipped): (ttft_s, [arrival times of text chunks], final usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    times, usage = [], None
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.strip() == b"data: [DONE]":
            break  # the connection stays open (keep-alive)
        if not line.startswith(b"data: "):
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            usage = d["usage"]
        ch = d.get("choices") or []
        if ch and (ch[0].get("text") or (ch[0].get("delta") or {}).get("content")):
            times.append(time.perf_counter())
    c.close()
    return times[0] - t0, times, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--neagari", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--skip-bench", action="store_true", help="skip `neagari bench`")
    a = ap.parse_args()

    if not a.skip_bench:
        run_bench(a)
    run_http(a)


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def run_bench(a):
    b = subprocess.run([a.neagari, "bench", "-m", a.model, "-t", str(a.threads), "-p", str(a.p),
                        "-n", str(a.n), "-r", str(a.r), "--no-bandwidth", "--json"],
                       check=True, capture_output=True, text=True)
    bench = json.loads(b.stdout)
    print("neagari bench:", json.dumps({k: v for k, v in bench.items() if "tok" in k or "pp" in k or "tg" in k}))


def run_http(a):
    port = free_port()
    srv = subprocess.Popen([a.neagari, "serve", "-m", a.model, "-t", str(a.threads), "-c", "4096",
                            "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if b"ok" in c.getresponse().read():
                    break
            except OSError:
                pass
            time.sleep(0.1)
        rng = random.Random(0)
        ttft, tg = [], []
        for i in range(a.r):
            # Different first token each run: nothing of the prompt is cached.
            ids = [2] + [rng.randrange(1000, 30000) for _ in range(a.p - 1)]
            t, times, usage = stream(port, "/v1/completions", {
                "prompt": ids, "max_tokens": a.n, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}})
            assert usage["prompt_tokens_details"]["cached_tokens"] <= 1, usage
            ttft.append(t)
            tg.append((len(times) - 1) / (times[-1] - times[0]))
        # The engine's own decode rate over the same runs (timed inside the worker): the
        # gap to the client's rate is what HTTP, JSON and SSE cost, free of machine drift.
        engine_tg = metric(port, "neagari_decode_tokens_per_second")
        client_tg = sum(a.n - 1 for _ in tg) / sum((a.n - 1) / x for x in tg)
        print(f"HTTP: prefill {a.p} tok: TTFT median {statistics.median(ttft) * 1000:.0f} ms "
              f"({a.p / statistics.median(ttft):.1f} tok/s incl. HTTP); decode seen by the client "
              f"{client_tg:.2f} tok/s, inside the engine {engine_tg:.2f} tok/s "
              f"(HTTP cost {100 * (1 - client_tg / engine_tg):.2f}%)")

        system = "You are a careful assistant. " + " ".join(
            f"Rule {i}: answer precisely and cite the rule number." for i in range(150))
        conv = [{"role": "system", "content": system},
                {"role": "user", "content": "What is rule 7?"}]
        t1, _, u1 = stream(port, "/v1/chat/completions", {
            "messages": conv, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}})
        conv2 = conv + [{"role": "assistant", "content": "Rule 7 says to answer precisely."},
                        {"role": "user", "content": "And rule 8?"}]
        t2, _, u2 = stream(port, "/v1/chat/completions", {
            "messages": conv2, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}})
        print(f"prefix reuse: turn 1 TTFT {t1 * 1000:.0f} ms ({u1['prompt_tokens']} prompt tok, "
              f"{u1['prompt_tokens_details']['cached_tokens']} cached); turn 2 TTFT {t2 * 1000:.0f} ms "
              f"({u2['prompt_tokens']} prompt tok, {u2['prompt_tokens_details']['cached_tokens']} cached)")
    finally:
        srv.terminate()
        srv.wait()


if __name__ == "__main__":
    main()
