#!/bin/bash
# Builds what a GPU run needs here (no CUDA needed: kernels compile by NVRTC on the device)
# and packs stripped copies into target/cuda-stage.txz (xz: ~5 MB, where gzip made 15 of the
# 64 MiB the device tool carries with the checkout): the CLI, the one-row GEMV timer (examples/cuda_gemv.rs)
# and the five GPU suites. The CLI of the previous staging is kept as `neagari_prev`, so one
# device call can time the change against what came before it on the same files (run.sh's
# AB entry `prev`). Then carry target/cuda-stage.txz and, on the GPU machine, from a
# checkout of the same commit: bash bench/cuda/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p neagari
cargo build --release -p neagari-backend --example cuda_gemv
cargo test --release -p neagari-backend --test cuda_ops --test cuda_gemv_rows --test cuda_hybrid \
    --no-run
cargo test --release -p neagari-engine --test cuda_models --test cuda_hybrid_models --no-run
D=target/cuda-stage/bin
prev=$(mktemp)
if [ -f "$D/neagari" ]; then cp "$D/neagari" "$prev"; else rm -f "$prev"; fi
rm -rf "$D" && mkdir -p "$D"
cp target/release/neagari target/release/examples/cuda_gemv "$D"/
for t in cuda_ops cuda_gemv_rows cuda_hybrid cuda_models cuda_hybrid_models; do
    # The newest test executable of that name (cargo keeps older hashes).
    f=$(ls -t target/release/deps/"$t"-* | grep -v '\.d$' | head -1)
    cp "$f" "$D/$t"
done
strip "$D"/*
if [ -f "$prev" ]; then mv "$prev" "$D/neagari_prev" && chmod 755 "$D/neagari_prev"; fi
rm -f target/cuda-stage.tgz
tar cf - -C target cuda-stage/bin | xz -T2 -9 > target/cuda-stage.txz
du -sh "$D" target/cuda-stage.txz
