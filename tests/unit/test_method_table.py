"""The method table (``spec_backend.methods``): the ground floor that the config, the vLLM hook and the
drafter registry read, and what each derives from it."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from spec_backend.config.methods import (
    AUX_HIDDEN_STATE_METHODS,
    EAGLE_METHODS,
    MODEL_FREE_METHODS,
    SPECULATIVE_METHODS,
    SpeculativeMethod,
    normalize_method,
)
from spec_backend.methods import ALIASES, METHODS, MTP_MODEL_TYPES, MethodSpec
from spec_backend.proposers.contract import Drafter
from spec_backend.proposers.registry import build_drafter, method_spec, resolve_builder


def _loaded_after(statement: str) -> list[str]:
    """Modules of interest that a fresh interpreter has loaded after running ``statement``."""
    code = (
        f"import sys\n{statement}\n"
        "print(' '.join(sorted(m for m in sys.modules if m == 'torch' or m.startswith('spec_backend.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_config_imports_neither_torch_nor_the_drafters() -> None:
    """The vocabulary sits below the config: validating a config loads no drafter package and no torch
    (the drafter package once broke vLLM-CPU's worker start-up, docs/vllm.md)."""
    loaded = _loaded_after("import spec_backend.config")
    assert "torch" not in loaded
    assert [m for m in loaded if m.startswith("spec_backend.proposers")] == []


def test_the_table_imports_nothing_of_the_project() -> None:
    package = set(_loaded_after("import spec_backend"))  # what the package's own __init__ loads
    assert set(_loaded_after("import spec_backend.methods")) - package == {"spec_backend.methods"}


def test_the_literal_lists_exactly_the_accepted_names_in_order() -> None:
    """``SpeculativeMethod`` is written out for mypy; the accepted names come from the table."""
    assert get_args(SpeculativeMethod) == SPECULATIVE_METHODS
    assert set(SPECULATIVE_METHODS) == {*METHODS, *ALIASES}
    assert SPECULATIVE_METHODS[:3] == ("ngram", "[ngram]", "ngram_gpu")  # an alias follows its method
    assert SPECULATIVE_METHODS[-len(MTP_MODEL_TYPES) :] == MTP_MODEL_TYPES


def test_config_sets_are_the_table_columns() -> None:
    assert EAGLE_METHODS == ("eagle", "eagle3", "dflash", "dspark", "mtp")
    assert AUX_HIDDEN_STATE_METHODS == ("eagle3", "dflash", "dspark", "extract_hidden_states")
    assert MODEL_FREE_METHODS == ("ngram", "ngram_gpu", "suffix", "extract_hidden_states")


@pytest.mark.parametrize("name", SPECULATIVE_METHODS)
def test_every_accepted_name_normalises_to_a_row(name: str) -> None:
    assert normalize_method(name) in METHODS  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", METHODS.values(), ids=lambda s: s.name)
def test_every_builder_path_resolves(spec: MethodSpec) -> None:
    """A typo in a ``"module:function"`` path fails here, not when a user picks the method."""
    builder = resolve_builder(spec)
    assert callable(builder) and builder.__name__ == spec.build.partition(":")[2]  # type: ignore[union-attr]
    assert method_spec(spec.name) is spec


def test_a_known_method_without_a_builder_is_refused_by_name() -> None:
    with pytest.raises(
        NotImplementedError, match=r"method 'typical' is not implemented yet \(available: ngram"
    ):
        resolve_builder(MethodSpec("typical", "eagle"))


def test_build_drafter_wraps_a_host_proposer() -> None:
    import torch

    from spec_backend.config import SpeculativeConfig
    from spec_backend.proposers.contract import DrafterContext
    from spec_backend.proposers.host_drafter import HostDrafter
    from spec_backend.proposers.suffix import SuffixProposer

    config = SpeculativeConfig(method="suffix", num_speculative_tokens=3)
    ctx = DrafterContext(config, torch.device("cpu"), torch.nn.Linear(1, 1), 2, 16, lambda path, dtype: None)  # type: ignore[arg-type, return-value]
    drafter = build_drafter(ctx)
    assert isinstance(drafter, HostDrafter) and isinstance(drafter, Drafter)
    assert isinstance(drafter.proposer, SuffixProposer) and drafter.num_speculative_tokens == 3
