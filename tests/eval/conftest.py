"""Eval tier set-up (``make test-eval``: lm-evaluation-harness in its own venv, .venv-eval).

The test module is skipped where lm-eval is not installed (``make test``). Nothing here may reach a
hub: lm-eval's tasks read local JSON-lines files and its ``hf`` backend loads the tiny model from a
folder, so the Hugging Face libraries are told to stay offline before lm-eval imports them.
``spec-backend serve`` is started as the server tests start it (``tests/unit/server_fixtures.py``, put
on the path here).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

if importlib.util.find_spec("lm_eval") is not None:  # only in .venv-eval: `make test` is left as it is
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
