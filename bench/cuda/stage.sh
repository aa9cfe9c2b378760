#!/bin/bash
# Builds what a GPU run needs here (no CUDA needed: kernels compile by NVRTC on the device)
# and stages stripped copies in target/cuda-stage/bin, small enough to carry to the device
# (~23 MB): the CLI, the one-row GEMV timer (examples/cuda_gemv.rs) and the four GPU suites.
# Then, on the GPU machine, from a checkout of the same commit: bash bench/cuda/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p neagari
cargo build --release -p neagari-backend --example cuda_gemv
cargo test --release -p neagari-backend --test cuda_ops --test cuda_hybrid --no-run
cargo test --release -p neagari-engine --test cuda_models --test cuda_hybrid_models --no-run
D=target/cuda-stage/bin
rm -rf "$D" && mkdir -p "$D"
cp target/release/neagari target/release/examples/cuda_gemv "$D"/
for t in cuda_ops cuda_hybrid cuda_models cuda_hybrid_models; do
    # The newest test executable of that name (cargo keeps older hashes).
    f=$(ls -t target/release/deps/"$t"-* | grep -v '\.d$' | head -1)
    cp "$f" "$D/$t"
done
strip "$D"/*
du -sh "$D"
