"""Users see no warnings: ``spec-backend generate`` (and with it ``make demo``, which runs the same
engine) printed transformers' ``past_key_values`` FutureWarning on every run, once per module kind.

The suite as a whole also turns that warning into an error (``pyproject.toml``'s ``filterwarnings``), so
every drafter and every forward the tests reach hands the cache over under the name the installed
transformers declares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spec_backend.runtime.hf_compat import cache_kwargs
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("quiet"), "llama", with_tokenizer=True)


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
        {"method": "draft_model", "model": "TARGET", "num_speculative_tokens": 2},
        {"method": "eagle3", "model": "EAGLE3", "num_speculative_tokens": 2},
    ],
    ids=["ngram", "draft_model", "eagle3"],
)
def test_generate_prints_no_warning(tiny: str, tmp_path: Path, spec: dict[str, object]) -> None:
    head = write_eagle3(tmp_path / "e3", tiny, "speculators", aux_ids=[0, 1, 2])
    spec = {k: {"TARGET": tiny, "EAGLE3": head}.get(str(v), v) for k, v in spec.items()}
    command = [sys.executable, "-W", "default", "-m", "spec_backend.cli", "generate", "--model", tiny]
    command += ["--prompt", "hello hello hello", "--max-tokens", "8", "--no-progress"]
    out = subprocess.run(
        [*command, "--speculative-config", json.dumps(spec)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr and "deprecated" not in out.stderr, out.stderr


def test_the_cache_goes_under_the_name_the_module_declares() -> None:
    class New:
        def forward(self, x: object, cache: object = None, **kwargs: object) -> None: ...

    class Old:
        def forward(self, x: object, past_key_values: object = None, **kwargs: object) -> None: ...

    cache = object()
    assert cache_kwargs(New(), cache) == {"cache": cache}
    assert cache_kwargs(Old(), cache) == {"past_key_values": cache}
