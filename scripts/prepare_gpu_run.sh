#!/usr/bin/env bash
# Before a GPU call (run here, where the package registries are reachable; the GPU machine has no
# network): the wheels benchmarks/gpu_suite.sh installs there into .whl/ (pydantic and stevedore with
# their dependencies, for the GPU machine's Python), and vLLM 0.33's rejection_sampler.py, taken from its
# wheel, into .peer/ (the peer bench_sampler_vllm.py reads at run time; nothing of it is committed: both
# folders are git-ignored). Pass both to the device call: carry [".whl", ".peer"].
#
#   bash scripts/prepare_gpu_run.sh            # GPU_PYTHON=3.12 (the GPU image's python3), VLLM=0.33.0
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_PYTHON=${GPU_PYTHON:-3.12}
VLLM=${VLLM:-0.33.0}
PEER=.peer/vllm_${VLLM}_rejection_sampler.py
mkdir -p .whl .peer
python3 -m pip download -q --only-binary=:all: --python-version "$GPU_PYTHON" -d .whl pydantic stevedore \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
if [ ! -s "$PEER" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" -d "$tmp" \
        "vllm==$VLLM" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    unzip -p "$tmp"/vllm-"$VLLM"-*.whl vllm/v1/sample/rejection_sampler.py >"$PEER"
fi
test -s "$PEER" || { echo "no rejection_sampler.py in vllm $VLLM's wheel" >&2; exit 1; }
echo "wheels in .whl/: $(ls .whl | tr '\n' ' ')"
echo "peer: $PEER ($(wc -l <"$PEER") lines)"
