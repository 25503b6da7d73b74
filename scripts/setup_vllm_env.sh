#!/usr/bin/env bash
# Build .venv-vllm: a separate virtual environment with vLLM for the `vllm` test tier.
#
# The main .venv never gets vLLM (it is ~6 GB and pins its own torch). This one does:
#   1. vllm==0.32.0 with its own torch pin (0.32.0 asks for torch 2.13.0, which satisfies the
#      machine's pip constraint file, so the constraint is left in force);
#   2. torchvision, torchaudio and torchcodec removed: vLLM drags them in, and their compiled
#      extensions do not match the CPU torch, which breaks `import vllm`;
#   3. this repository (core + cuda + ascend backends, editable) and the test tools, installed
#      with a constraint that freezes the torch vLLM chose so pip cannot replace it.
#
# Usage: scripts/setup_vllm_env.sh [VENV_DIR]   (default: .venv-vllm next to this script's repo)
# Re-running is cheap: a stamp file records a finished install.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_PIN="${VLLM_PIN:-vllm==0.32.0}"
STAMP="$VENV/.installed-$(echo "$VLLM_PIN" | tr -c 'A-Za-z0-9.' '_')"

if [[ -f "$STAMP" ]]; then
    echo "setup_vllm_env: $VENV is ready ($VLLM_PIN)"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

echo "setup_vllm_env: installing $VLLM_PIN (several GB, a few minutes)"
"$PY" -m pip install -q "$VLLM_PIN"

# These three break `import vllm` against the CPU torch; nothing in the test tier needs them.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

# Freeze vLLM's torch for the rest of the install.
FREEZE="$(mktemp)"
trap 'rm -f "$FREEZE"' EXIT
"$PY" -m pip freeze | grep -iE '^(torch|triton|vllm)==' >"$FREEZE" || true
echo "setup_vllm_env: keeping $(tr '\n' ' ' <"$FREEZE")"

"$PY" -m pip install -q -c "$FREEZE" \
    -e "$ROOT" -e "$ROOT/backends/cuda" -e "$ROOT/backends/ascend" \
    pytest hypothesis scipy

"$PY" - <<'EOF'
import importlib.metadata as md
import vllm  # noqa: F401  (fails loudly if the environment is broken)
print("setup_vllm_env: vllm", md.version("vllm"), "torch", md.version("torch"))
EOF
touch "$STAMP"
