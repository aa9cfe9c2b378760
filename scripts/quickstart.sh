#!/usr/bin/env bash
# Fresh machine -> release build -> test model (via pip) -> greedy generation.
#   ./scripts/quickstart.sh                 # "def fibonacci(n):", 64 tokens
#   ./scripts/quickstart.sh -p "Hello" -n 32  # extra args go to `neagari run`
# Needs curl only when Rust is missing (rustup's installer), python3 + pip for the model.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null; then
  if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "==> installing Rust (rustup, minimal profile)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

echo "==> cargo build --release -p neagari"
cargo build --release -p neagari

echo "==> test model"
model="${NEAGARI_TEST_MODEL:-}"
if [[ -z "$model" || ! -f "$model" ]]; then
  model="$(scripts/fetch_test_model.sh)"
fi

args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(-p "def fibonacci(n):" -n 64 --temp 0)
fi
echo "==> neagari run -m $model ${args[*]}"
exec target/release/neagari run -m "$model" "${args[@]}"
