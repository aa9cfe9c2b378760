"""Drives a running `neagari serve` with the official OpenAI and Anthropic Python SDKs.

Usage: serve_e2e.py BASE_URL API_KEY   (run by crates/neagari/tests/serve.rs)

The server runs the Gemma 3 270M test model with -c 512, --max-queue 9 and test hooks on.
Every check runs; the exit status is 1 if any failed. Generation lengths stay small: the
model decodes roughly 50-80 tokens/s on two cores.
"""

import concurrent.futures as cf
import json
import sys
import time
import traceback

import http.client
import urllib.error
import urllib.parse
import urllib.request

import anthropic
import openai

BASE, KEY = sys.argv[1], sys.argv[2]
oai = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
ant = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
HDR = {"Authorization": "Bearer " + KEY}
MSG = [{"role": "user", "content": "Write a short poem about the sea."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANT_WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": WEATHER["function"]["parameters"],
}



class Resp:
    def __init__(self, status, headers, body):
        self.status_code, self.headers, self.text = status, headers, body

    def json(self):
        return json.loads(self.text)


def call(method, path, headers=None, json_body=None, content=None, timeout=120):
    """A plain HTTP request (no SDK): status, headers (lower-case keys) and body text."""
    data = content.encode() if content is not None else (
        json.dumps(json_body).encode() if json_body is not None else None)
    h = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(BASE + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Resp(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode())
    except urllib.error.HTTPError as e:
        return Resp(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode())


T0 = {"temperature": 0}
failures = []
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def metric(name):
    text = call("GET", "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} missing:\n{text}")


@check
def health_models_metrics():
    h = call("GET", "/health").json()
    assert h["status"] == "ok" and h["device"].startswith("cpu"), h
    ids = [m.id for m in oai.models.list().data]
    assert len(ids) == 1 and ids[0], ids
    text = call("GET", "/metrics").text
    for name in ["neagari_requests_total", "neagari_prompt_tokens_total",
                 "neagari_completion_tokens_total", "neagari_prefill_tokens_per_second",
                 "neagari_decode_tokens_per_second", "neagari_queue_depth",
                 "neagari_prefix_cache_hit_tokens_total"]:
        assert name in text, name


@check
def chat_stream_equals_non_stream_and_prefix_reuse():
    r = oai.chat.completions.create(model="any", messages=MSG, max_tokens=8, temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content, r
    assert c.finish_reason in ("length", "stop"), c.finish_reason
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 5, r.usage
    # Greedy streaming gives the same text, and the same prompt is now fully cached.
    chunks = list(oai.chat.completions.create(
        model="any", messages=MSG, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content, (text, c.message.content)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    u = chunks[-1].usage
    assert u.prompt_tokens == r.usage.prompt_tokens
    assert u.prompt_tokens_details.cached_tokens == u.prompt_tokens - 1, u
    # A follow-up turn reuses the whole first turn.
    msgs = MSG + [{"role": "assistant", "content": c.message.content},
                  {"role": "user", "content": "Another one."}]
    r2 = oai.chat.completions.create(model="any", messages=msgs, max_tokens=4, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1, r2.usage


@check
def prefix_cache_survives_a_side_request():
    # An agent's main conversation, then a side request (another system prompt), then the
    # main conversation's next turn: that turn still finds its prefix (second KV slot).
    main = [{"role": "system", "content": "You are a helpful assistant for sailors. " * 8},
            {"role": "user", "content": "Name a knot."}]
    r1 = oai.chat.completions.create(model="any", messages=main, max_tokens=3, temperature=0)
    side = [{"role": "system", "content": "Summarize in five words."},
            {"role": "user", "content": "The sea is big and blue and deep."}]
    oai.chat.completions.create(model="any", messages=side, max_tokens=3, temperature=0)
    main += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "Another."}]
    r2 = oai.chat.completions.create(model="any", messages=main, max_tokens=3, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1, (r1.usage, r2.usage)


@check
def stop_sequence_and_seed():
    r = oai.chat.completions.create(model="any", messages=MSG, max_tokens=12, temperature=0)
    full = r.choices[0].message.content
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2]
    r2 = oai.chat.completions.create(model="any", messages=MSG, max_tokens=12, temperature=0,
                                     stop=[stop])
    assert r2.choices[0].message.content == full[:full.index(stop)], (full, r2)
    assert r2.choices[0].finish_reason == "stop"
    extra = {"top_k": 0, "min_p": 0.0}
    a = oai.chat.completions.create(model="any", messages=MSG, max_tokens=8, temperature=1.0,
                                    seed=42, top_p=1.0, extra_body=extra)
    b = oai.chat.completions.create(model="any", messages=MSG, max_tokens=8, temperature=1.0,
                                    seed=42, top_p=1.0, extra_body=extra)
    assert a.choices[0].message.content == b.choices[0].message.content


@check
def logprobs_greedy_token_is_the_top_one():
    r = oai.chat.completions.create(model="any", messages=MSG, max_tokens=5, temperature=0,
                                    logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) >= 1
    for t in lp:
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
        assert t.logprob <= 0 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    assert "".join(t.token for t in lp) == r.choices[0].message.content


@check
def completions_endpoint():
    r = oai.completions.create(model="any", prompt="The capital of France is", max_tokens=4,
                               temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens <= 4, r
    s = "".join(c.choices[0].text for c in oai.completions.create(
        model="any", prompt="The capital of France is", max_tokens=4, temperature=0, stream=True))
    assert s == r.choices[0].text, (s, r.choices[0].text)


@check
def max_tokens_past_context_end_is_clamped():
    long = "word " * 470
    r = oai.chat.completions.create(model="any", messages=[{"role": "user", "content": long}],
                                    max_tokens=32000, temperature=0, stop=None,
                                    extra_body={"ignore": 1})
    u = r.usage
    assert u.prompt_tokens + u.completion_tokens <= 512
    if r.choices[0].finish_reason == "length":
        assert u.prompt_tokens + u.completion_tokens >= 511, u


@check
def json_schema_output_validates():
    import jsonschema
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    r = oai.chat.completions.create(
        model="any", max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "Give a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    obj = json.loads(r.choices[0].message.content)
    jsonschema.validate(obj, schema)
    assert r.choices[0].finish_reason == "stop"
    r = oai.chat.completions.create(model="any", max_tokens=40, temperature=0, messages=MSG,
                                    response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    try:
        oai.chat.completions.create(
            model="any", max_tokens=4, messages=MSG,
            response_format={"type": "json_schema", "json_schema": {
                "name": "bad", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}})
        raise AssertionError("an unresolvable $ref compiled")
    except openai.BadRequestError as e:
        assert "schema" in str(e), e


@check
def openai_tool_call_round_trip():
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = oai.chat.completions.create(model="any", messages=msgs, tools=[WEATHER],
                                    tool_choice="required", max_tokens=40, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert isinstance(args.get("city"), str), args
    assert not ch.message.content or "<tool_call>" not in ch.message.content
    # Streaming gives the same call, its arguments in pieces.
    parts = {}
    names = {}
    finish = None
    for chunk in oai.chat.completions.create(model="any", messages=msgs, tools=[WEATHER],
                                             tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                             max_tokens=40, temperature=0, stream=True):
        d = chunk.choices[0].delta
        assert not (d.content and "<tool_call>" in d.content), d
        for tc in d.tool_calls or []:
            if tc.function.name:
                names[tc.index] = tc.function.name
            parts[tc.index] = parts.get(tc.index, "") + (tc.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert names == {0: "get_weather"} and json.loads(parts[0]) == args, (names, parts)
    assert finish == "tool_calls"
    msgs += [ch.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    r2 = oai.chat.completions.create(model="any", messages=msgs, tools=[WEATHER], max_tokens=8,
                                     temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens_details.cached_tokens > 0


@check
def anthropic_messages_and_stream_sequence():
    m = ant.messages.create(model="claude-local-test", max_tokens=8, messages=MSG,
                            system=[{"type": "text", "text": "You are a poet."}], extra_body=T0)
    assert m.type == "message" and m.role == "assistant" and m.model == "claude-local-test"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("max_tokens", "end_turn") and m.usage.output_tokens <= 8
    with ant.messages.stream(model="claude-local-small", max_tokens=8, messages=MSG,
                             system="You are a poet.", extra_body=T0) as s:
        final = s.get_final_message()
    assert final.content[0].text == m.content[0].text
    assert final.usage.cache_read_input_tokens > 0, final.usage
    # Raw events: the SDK hides pings.
    raw = call("POST", "/v1/messages?beta=true", headers={"x-api-key": KEY}, json_body={
        "model": "claude-x", "max_tokens": 6, "messages": MSG, "stream": True, "temperature": 0})
    assert raw.headers["content-type"].startswith("text/event-stream"), raw.headers
    events = [ln[7:] for ln in raw.text.splitlines() if ln.startswith("event: ")]
    datas = [json.loads(ln[6:]) for ln in raw.text.splitlines() if ln.startswith("data: ")]
    assert [d["type"] for d in datas] == events, (events, datas)
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens" and datas[-2]["usage"]["output_tokens"] == 6
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"], events
    body = [e for e in events[1:-2] if e != "ping"]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop", events
    assert set(body[1:-1]) == {"content_block_delta"}, events
    assert events[events.index("content_block_start") + 1] == "ping", events
    # stop_sequences
    full = m.content[0].text
    w = full.split()
    if len(w) >= 2:
        stop = w[1]
        m2 = ant.messages.create(model="claude-x", max_tokens=8, messages=MSG, extra_body=T0,
                                 system=[{"type": "text", "text": "You are a poet."}],
                                 stop_sequences=[stop])
        assert m2.stop_reason == "stop_sequence" and m2.stop_sequence == stop, m2
        assert m2.content[0].text == full[:full.index(stop)]


@check
def anthropic_tool_use_round_trip():
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = ant.messages.create(model="claude-local-test", max_tokens=40, messages=msgs,
                            tools=[ANT_WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                            extra_body=T0)
    assert m.stop_reason == "tool_use", m
    tu = [b for b in m.content if b.type == "tool_use"][0]
    assert tu.name == "get_weather" and isinstance(tu.input.get("city"), str), tu
    with ant.messages.stream(model="claude-local-test", max_tokens=40, messages=msgs,
                             tools=[ANT_WEATHER], tool_choice={"type": "any"}, extra_body=T0) as s:
        f = s.get_final_message()
    tu2 = [b for b in f.content if b.type == "tool_use"][0]
    assert f.stop_reason == "tool_use" and tu2.input == tu.input, f
    msgs += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id,
                                           "content": "18 C and sunny"}]}]
    m2 = ant.messages.create(model="claude-local-test", max_tokens=8, messages=msgs,
                             tools=[ANT_WEATHER], extra_body=T0)
    assert m2.stop_reason in ("end_turn", "max_tokens", "tool_use"), m2


@check
def count_tokens_counts_tools():
    a = ant.messages.count_tokens(model="claude-x", messages=MSG).input_tokens
    b = ant.messages.count_tokens(model="claude-x", messages=MSG, tools=[ANT_WEATHER]).input_tokens
    c = oai.chat.completions.create(model="any", messages=MSG, max_tokens=1).usage.prompt_tokens
    assert a == c, (a, c)
    assert b > a + 20, (a, b)


@check
def auth_is_required():
    bad = openai.OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    bad = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model="claude-x", max_tokens=1, messages=MSG)
        raise AssertionError("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "authentication_error"
    ok = call("POST", "/v1/messages", headers={"x-api-key": KEY},
              json_body={"model": "claude-x", "max_tokens": 1, "messages": MSG})
    assert ok.status_code == 200, ok.text
    assert call("GET", "/health").status_code == 200


@check
def malformed_requests_are_400_in_each_shape():
    def post(path, body, raw=False):
        if raw:
            return call("POST", path, headers=HDR, content=body)
        return call("POST", path, headers=HDR, json_body=body)

    cases = [
        ("/v1/chat/completions", "{not json", True),
        ("/v1/chat/completions", {"messages": "hi"}, False),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, False),
        ("/v1/chat/completions", {"messages": MSG, "max_tokens": "ten"}, False),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, False),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 600}]}, False),
        ("/v1/completions", {"prompt": [1, 2, 99999999]}, False),
    ]
    for path, body, raw in cases:
        r = post(path, body, raw)
        assert r.status_code == 400, (path, body if raw else str(body)[:80], r.status_code, r.text)
        e = r.json()["error"]
        assert e["type"] == "invalid_request_error" and e["message"], r.text
    ant_cases = [
        ("{not json", True),
        ({"model": "claude-x", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, False),
        ({"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}, False),
        ({"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "word " * 600}]}, False),
    ]
    for body, raw in ant_cases:
        r = post("/v1/messages?beta=true", body, raw)
        assert r.status_code == 400, (str(body)[:80], r.status_code, r.text)
        j = r.json()
        assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error", j
    img = post("/v1/messages", ant_cases[2][0]).json()["error"]["message"]
    assert "image" in img and "not supported" in img, img
    # Fields real clients send that change nothing here are accepted.
    r = post("/v1/messages?beta=true", {
        "model": "claude-opus-4-1", "max_tokens": 2, "messages": MSG, "metadata": {"user_id": "u"},
        "context_management": {"edits": []}, "output_config": {}, "thinking": {"type": "disabled"}})
    assert r.status_code == 200, r.text


@check
def disconnect_cancels_and_next_request_is_served_at_once():
    before = metric("neagari_generations_cancelled_total")
    u = urllib.parse.urlparse(BASE)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", headers={**HDR, "content-type": "application/json"},
                 body=json.dumps({"messages": MSG, "max_tokens": 400, "stream": True}))
    r = conn.getresponse()
    assert r.status == 200
    n = 0
    while n < 3:
        line = r.fp.readline()
        assert line, "the stream ended early"
        if line.startswith(b"data: "):
            n += 1
    conn.sock.close()
    conn.close()
    t = time.time()
    while metric("neagari_generations_cancelled_total") <= before:
        assert time.time() - t < 5, "the engine did not notice the disconnect"
        time.sleep(0.05)
    assert metric("neagari_queue_depth") == 0
    t = time.time()
    r = oai.chat.completions.create(model="any", messages=MSG, max_tokens=2)
    assert time.time() - t < 5 and r.choices[0].message.content is not None


@check
def eight_concurrent_streams():
    def one(i):
        text, finish = "", None
        for ch in oai.chat.completions.create(
                model="any", messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                max_tokens=6, stream=True, temperature=0.7, seed=i):
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        return text, finish

    with cf.ThreadPoolExecutor(8) as ex:
        res = list(ex.map(one, range(8)))
    for text, finish in res:
        assert finish in ("stop", "length"), res


@check
def queue_limit_gives_429_with_retry_after():
    def one(_):
        return call("POST", "/v1/chat/completions", headers=HDR,
                    json_body={"messages": MSG, "max_tokens": 6})

    with cf.ThreadPoolExecutor(14) as ex:
        res = list(ex.map(one, range(14)))
    codes = sorted(r.status_code for r in res)
    assert set(codes) <= {200, 429}, codes
    assert codes.count(429) >= 1, codes
    busy = [r for r in res if r.status_code == 429][0]
    assert busy.headers.get("retry-after") and busy.json()["error"]["message"], busy.headers


@check
def a_panic_is_a_500_and_the_server_keeps_serving():
    try:
        oai.chat.completions.create(model="any", max_tokens=2,
                                    messages=[{"role": "user", "content": "__neagari_test_panic__"}])
        raise AssertionError("no error")
    except openai.InternalServerError:
        pass
    r = oai.chat.completions.create(model="any", messages=MSG, max_tokens=2)
    assert r.choices[0].message.content is not None


if __name__ == "__main__":
    t0 = time.time()
    for fn in CHECKS:
        t = time.time()
        try:
            fn()
            print(f"ok   {fn.__name__} ({time.time() - t:.1f} s)", flush=True)
        except Exception:
            failures.append(fn.__name__)
            print(f"FAIL {fn.__name__} ({time.time() - t:.1f} s)", flush=True)
            traceback.print_exc()
    print(f"{len(CHECKS) - len(failures)}/{len(CHECKS)} passed in {time.time() - t0:.1f} s")
    sys.exit(1 if failures else 0)
