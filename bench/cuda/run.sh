#!/bin/bash
# On a GPU machine, from the repository root with target/cuda-stage.txz carried (or
# target/cuda-stage/bin; bench/cuda/stage.sh makes both): the GPU suites, then `neagari
# bench` on random-weight files of real shapes (neagari synth), each run's figures as the
# CLI prints them. Environment (all optional):
#   TESTS=1            run the five GPU suites first (in parallel; logs in $OUT/suites.log)
#   OPS_FILTER="a b"   only these cuda_ops tests (ROWS_FILTER: cuda_gemv_rows tests)
#   TYPES="Q1_0 TQ2_0 Q4_K gemma"   files to bench: 27B shapes of those types, Gemma 3 270M
#   AB_<TYPE>="def VAR=1,VAR2=x prev"  runs per file, each an env (a comma before NAME=
#                      starts the next variable, so VAR=a,b keeps its comma), or `prev`:
#                      the CLI staged before this one (neagari_prev), also with an env:
#                      prev,VAR=1; `@name` (also `@name,VAR=1`) runs
#                      target/cuda-stage/bin/neagari_name, a variant build copied in by hand
#   ARGS="-p 512 -n 128 -r 2 --argmax --verify 8"   bench arguments for the 27B files
#   GEMV="Q1_0 TQ2_0"  time the one-row GEMV at the 27B's shapes first (examples/cuda_gemv.rs);
#                      GEMV_ROWS=8 times it with 8 activation rows (the verify's kernels)
#   LLAMA_BENCH=path   a llama-bench binary built elsewhere: the same files, -ngl 99 -fa 1
# The GEMV timings and bench runs are also in $LOG/bench.log (whole, where a tool keeps only
# the tail of the output).
# A fresh machine spends minutes compiling kernels: with KCACHE_OUT=1 and $OUT, NVRTC's kernel
# cache comes back as $OUT/kcache-ptx.txz (~2 MB); put in target/kcache/ and carried next
# time, it is unpacked first and only modules whose source changed compile again
# (cuda_hybrid's fused DeltaNet test: 18 s in all). xz through Python's lzma: the machine
# may have no xz.
# The driver's own cache (~30 MB) does not fit beside the checkout and the stage in a call.
set -uo pipefail
R0=$(pwd)
B=$R0/target/cuda-stage/bin
unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)" "$1"; }
[ -x "$B/neagari" ] || unxz "$R0/target/cuda-stage.txz" | tar x -C "$R0/target" || exit 1
W=${WORK:-/tmp/neagari-cuda}
LOG=${OUT:-/tmp}
mkdir -p "$W"
T0=$(date +%s)
[ -f "$R0/target/kcache/kcache-ptx.txz" ] && unxz "$R0/target/kcache/kcache-ptx.txz" | tar x -C "$HOME"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
file_of() {
    if [ "$1" = gemma ]; then echo "$W/gemma3-270m.gguf"; else echo "$W/qwen3.6-27b-$1.gguf"; fi
}
synth() {
    local f
    f=$(file_of "$1")
    [ -f "$f" ] && return
    if [ "$1" = gemma ]; then
        "$B/neagari" synth --like gemma3-270m -o "$f" > /dev/null
    else
        "$B/neagari" synth --like qwen3.6-27b --type "$1" -o "$f" > /dev/null
    fi
}
TYPES=${TYPES:-Q1_0 TQ2_0 Q4_K gemma}
for t in $TYPES; do synth "$t" & done
if [ -n "${TESTS:-}" ]; then
    export NEAGARI_FIXTURES=$R0/tests/fixtures
    export NEAGARI_HYBRID_FIXTURES=$R0/crates/model/tests/fixtures/hybrid
    wait
    # Every module compiled once, into the kernel cache (~/.cache/neagari/kernels) that the
    # suites below then read, instead of each compiling the same modules at once.
    (cd crates/backend && timeout 420 "$B/cuda_ops" --exact kernels_compile_with_nvrtc \
        > "$LOG/compile.log" 2>&1; grep -E "^test result" "$LOG/compile.log")
    # Each suite's log in $W, all of them in $LOG/suites.log at the end (the device tool
    # brings back only a few files).
    suite() { # dir name [env]
        (cd "$1" && env ${3:-} timeout 600 "$B/$2" --test-threads 1 ${4:-} > "$W/$2.log" 2>&1
         echo "$2 rc $?" >> "$W/$2.log") &
    }
    suite crates/backend cuda_ops "" "${OPS_FILTER:-}"
    suite crates/backend cuda_gemv_rows "" "${ROWS_FILTER:-}"
    suite crates/backend cuda_hybrid
    suite crates/engine cuda_hybrid_models
    synth gemma
    suite crates/engine cuda_models "NEAGARI_GPU_VS_CPU=$(file_of gemma)"
    wait
    SUITES="cuda_ops cuda_gemv_rows cuda_hybrid cuda_hybrid_models cuda_models"
    for s in $SUITES; do
        grep -E "^test result|rc [0-9]+$|FAILED|panicked|^note" "$W/$s.log" | head -8
    done
    for s in $SUITES; do echo "==== $s"; cat "$W/$s.log"; done > "$LOG/suites.log"
    echo "suites done after $(( $(date +%s) - T0 )) s"
fi
wait
{
if [ -n "${GEMV:-}" ]; then ROWS=${GEMV_ROWS:-1} timeout 300 "$B/cuda_gemv" $GEMV; fi
for t in $TYPES; do
    f=$(file_of "$t")
    v="AB_$t"
    for e in ${!v:-def}; do
        envs="" bin=neagari v=$e
        case $v in
            prev*) bin=neagari_prev v=${v#prev} v=${v#,} ;;
            @*) bin=neagari_${v%%,*} bin=${bin/@/} v=${v#@} v=${v#*,}; [ "$v" = "${e#@}" ] && v= ;;
        esac
        if [ -n "$v" ] && [ "$v" != def ]; then envs=$(echo "$v" | sed -E 's/,([A-Za-z_][A-Za-z0-9_]*=)/ \1/g'); fi
        if [ "$t" = gemma ]; then args="-p 512 -n 128 -r 3 --argmax"
        else args=${ARGS:--p 512 -n 128 -r 2 --argmax --verify 8}; fi
        echo "== neagari $t [$e] $args"
        env $envs timeout 300 "$B/$bin" bench --device cuda -m "$f" $args 2>&1 | grep -vE "^\s*$"
    done
    if [ -n "${LLAMA_BENCH:-}" ] && [ "$t" != TQ2_0 ]; then
        echo "== llama.cpp $t"
        timeout 300 "$LLAMA_BENCH" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "^\|"
    fi
done
} 2>&1 | tee "$LOG/bench.log"
if [ -n "${KCACHE_OUT:-}" ] && [ -n "${OUT:-}" ]; then
    tar c -C "$HOME" .cache/neagari |
        python3 -c "import lzma, shutil, sys
with lzma.open(sys.argv[1], 'w', preset=9) as f: shutil.copyfileobj(sys.stdin.buffer, f)" "$OUT/kcache-ptx.txz"
    # A copy that ended early (session 30's had no end marker) is worse than none.
    unxz "$OUT/kcache-ptx.txz" | tar t > /dev/null || echo "kcache-ptx.txz does not unpack"
    ls -l "$OUT"/kcache-ptx.txz
fi
echo "total $(( $(date +%s) - T0 )) s"
