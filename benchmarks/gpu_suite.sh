#!/usr/bin/env bash
# The GPU runs of one session, from a bare checkout, in one command, in the order issue 43 asks: the
# engine with and without graphs and speculation, the plugin's verification against vLLM's own, the cuda
# test tier, a second engine run, the sampler against the bandwidth floor. Results go to $OUT (default
# ./gpu-results): env.txt, engine.txt, engine-profile-*.txt, sampler-vllm.txt, trees.txt, pytest.log,
# engine-2.txt, sampler.txt.
#
#   OUT=/tmp/res SUITE_SECONDS=570 bash benchmarks/gpu_suite.sh
#
# Knobs (environment): PYTEST_TARGETS (test paths), ENGINE_SECONDS, ENGINE_PROFILE_SECONDS (per mode of
# ENGINE_PROFILE_MODES, default "plain ngram"; empty: none), VLLM_SAMPLER_SECONDS, PYTEST_SECONDS,
# TREES_SECONDS, ENGINE2_SECONDS, SAMPLER_SECONDS (0 skips a stage) cap the stages; ENGINE_ARGS and ENGINE2_ARGS add flags
# to the engine runs (e.g. "--modes plain,ngram --graphs on --no-peer"; "--attention auto,triton,triton+fused"
# adds the triton attention and the fused kernels as an A/B in the same run), ENGINE2_MODELS names the second
# run's models (empty: no second run); VLLM_FILE is vLLM's rejection_sampler.py taken from its wheel
# (default .peer/vllm_0.33.0_rejection_sampler.py; absent: that stage is skipped), VLLM_SAMPLER_ARGS adds
# flags to bench_sampler_vllm.py;
# SAMPLER_ITERS, SAMPLER_SPLITS (vocab splits to sweep, default 32), SAMPLER_ARGS (more bench flags,
# default "--composed": the fused verification beside the composed kernels in the same run; e.g.
# "--composed --vocab-blocks 1024,4096 --modes standard,block"; "--fused-blocks 512,1024" sweeps the fused
# path's tile), PROFILE_SPLITS (a kernel profile per split count, comma-separated, default 32; empty:
# none), PROFILE_MODES (space-separated modes to profile, default "standard"), ENGINE_MODELS, ENGINE_TOKENS.
#
# The GPU machine has torch, triton and transformers but no network: wheels of the other dependencies
# (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, stevedore), downloaded
# for its Python into .whl/, are installed first when present. Each stage runs under its own time cap
# inside SUITE_SECONDS, so one stage that hangs cannot take the others' results with it.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUDGET=${SUITE_SECONDS:-570}
START=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

left() { echo $((BUDGET - ($(date +%s) - START))); }
cap() { local want=$1 rest; rest=$(left); if [ "$rest" -lt "$want" ]; then echo "$rest"; else echo "$want"; fi; }
stage() {  # stage NAME CAP_SECONDS COMMAND...: run under min(cap, time left), log to $OUT/NAME
    local name=$1 limit; limit=$(cap "$2"); shift 2
    if [ "$limit" -le 5 ]; then echo "== $name: skipped, no time left" | tee -a "$OUT/$name"; return; fi
    echo "== $name (cap ${limit}s, $(left)s left): $*" | tee -a "$OUT/$name"
    timeout --kill-after=5 "$limit" "$@" >>"$OUT/$name" 2>&1
    echo "== $name: exit $? after $(( $(date +%s) - START ))s" | tee -a "$OUT/$name"
}

if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
# entry points (the backend registry) come from the installed metadata: an editable install, no network
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . -e backends/cuda >"$OUT/env.txt" 2>&1 \
    || echo "editable install failed: running from PYTHONPATH" >>"$OUT/env.txt"
export PYTHONPATH="$PWD:$PWD/backends/cuda${PYTHONPATH:+:$PYTHONPATH}"

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $PY - <<'EOF'
import sys, torch, triton, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, transformers {transformers.__version__}")
p = torch.cuda.get_device_properties(0)
print(f"{p.name}: {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
from spec_backend.backends import load_backend
print("load_backend('cuda'):", type(load_backend("cuda")).__name__)
EOF
} >>"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

engine() {  # engine FILE CAP MODELS ARGS
    stage "$1" "$2" $PY benchmarks/bench_engine_gpu.py --models "$3" --max-tokens "${ENGINE_TOKENS:-64}" $4
}
engine engine.txt "${ENGINE_SECONDS:-$BUDGET}" "${ENGINE_MODELS:-smollm2-random,random-1b}" "${ENGINE_ARGS-}"
# where a graph step's time goes (host Python against device kernels), plain and ngram at batch 1
for mode in ${ENGINE_PROFILE_MODES-plain ngram}; do
    stage "engine-profile-$mode.txt" "${ENGINE_PROFILE_SECONDS:-60}" $PY benchmarks/profile_engine_gpu.py --mode "$mode"
done
VLLM_FILE=${VLLM_FILE:-.peer/vllm_0.33.0_rejection_sampler.py}
if [ -f "$VLLM_FILE" ]; then
    stage sampler-vllm.txt "${VLLM_SAMPLER_SECONDS:-150}" $PY benchmarks/bench_sampler_vllm.py \
        --vllm-file "$VLLM_FILE" ${VLLM_SAMPLER_ARGS-}
fi
# token trees against chains at the same verify budget (#42), tree steps captured as graphs
stage trees.txt "${TREES_SECONDS:-120}" $PY benchmarks/bench_trees.py --backend cuda --batches 1 8 \
    --tokens "${ENGINE_TOKENS:-64}" --runs 3
# the cuda tier, and the triton sampler's unit tests with compiled kernels (tests/unit run them interpreted)
stage pytest.log "${PYTEST_SECONDS:-170}" $PY -m pytest -p no:cacheprovider -q -rfEs \
    ${PYTEST_TARGETS:-backends/cuda/tests tests/unit/test_triton_sampler.py tests/unit/test_triton_fused_verify.py \
        tests/unit/test_tree_ops.py}
[ -n "${ENGINE2_MODELS-}" ] && engine engine-2.txt "${ENGINE2_SECONDS:-$BUDGET}" "$ENGINE2_MODELS" "${ENGINE2_ARGS-}"
stage sampler.txt "${SAMPLER_SECONDS:-200}" $PY benchmarks/bench_sampler_bandwidth.py --iters "${SAMPLER_ITERS:-30}" \
    --vocab-splits "${SAMPLER_SPLITS:-32}" ${SAMPLER_ARGS---composed}
PROFILE=${PROFILE_SPLITS-32}
[ -n "$PROFILE" ] && for n in ${PROFILE//,/ }; do
    for mode in ${PROFILE_MODES:-standard}; do
        stage "profile-x$n-$mode.txt" 40 $PY benchmarks/profile_sampler_gpu.py --vocab-splits "$n" --mode "$mode"
    done
done

echo "== summary"
for f in engine.txt engine-2.txt; do [ -f "$OUT/$f" ] && sed -n '/^model /,$p' "$OUT/$f"; done
grep -h -E "ms/step" "$OUT"/engine-profile-*.txt 2>/dev/null
[ -f "$OUT/sampler-vllm.txt" ] && grep -E "^ *[0-9]+ +[0-9]+ |^device|^ratio|DIFFER|DISAGREE" "$OUT/sampler-vllm.txt"
[ -f "$OUT/trees.txt" ] && grep -E "^ +[0-9]+ " "$OUT/trees.txt"
[ -f "$OUT/pytest.log" ] && tail -n 15 "$OUT/pytest.log"
[ -f "$OUT/sampler.txt" ] && grep -E "^target|device:" "$OUT/sampler.txt"
true
