#!/usr/bin/env bash
# Build .venv-eval: a separate virtual environment with lm-evaluation-harness for the `eval` test tier
# (tests/eval: lm-eval's own clients drive `spec-backend serve`, and its Hugging Face backend scores the
# same model for comparison).
#
# The main .venv never gets lm-eval: it brings datasets, pyarrow, pandas, evaluate, scikit-learn,
# sacrebleu and rouge-score (several hundred MB) that nothing else here needs. This one does:
#   1. torch==2.13.0 first (the CPU wheel): installed later as a dependency, an unpinned torch would be
#      the multi-GB CUDA build;
#   2. this repository with the serve extra (editable), lm-eval with its `api` (local-completions,
#      local-chat-completions) and `hf` extras, and the test tools, under a constraint that freezes
#      that torch so pip cannot replace it.
#
# Usage: scripts/setup_eval_env.sh [VENV_DIR]   (default: .venv-eval next to this script's repo)
# Re-running is cheap: a stamp file records a finished install.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-eval}"
PYTHON="${PYTHON:-python3}"
LM_EVAL_PIN="${LM_EVAL_PIN:-lm_eval==0.4.13}"
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
STAMP="$VENV/.installed-$(echo "$LM_EVAL_PIN $TORCH_PIN" | tr -c 'A-Za-z0-9.' '_')"

if [[ -f "$STAMP" ]]; then
    echo "setup_eval_env: $VENV is ready ($LM_EVAL_PIN)"
    exit 0
fi

"$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

echo "setup_eval_env: installing $TORCH_PIN, then $LM_EVAL_PIN (a few hundred MB)"
"$PY" -m pip install -q "$TORCH_PIN"

FREEZE="$(mktemp)"
trap 'rm -f "$FREEZE"' EXIT
"$PY" -m pip freeze | grep -iE '^torch==' >"$FREEZE"
echo "setup_eval_env: keeping $(tr '\n' ' ' <"$FREEZE")"

"$PY" -m pip install -q -c "$FREEZE" -e "$ROOT[serve]" "${LM_EVAL_PIN/==/[api,hf]==}" \
    "pytest>=8" "httpx>=0.27"

"$PY" - <<'PYEOF'
import importlib.metadata as md
import lm_eval  # noqa: F401  (fails loudly if the environment is broken)
import lm_eval.models.openai_completions  # noqa: F401  (local-completions, local-chat-completions)
import lm_eval.models.huggingface  # noqa: F401  (hf)
print("setup_eval_env: lm_eval", md.version("lm_eval"), "torch", md.version("torch"))
PYEOF
touch "$STAMP"
