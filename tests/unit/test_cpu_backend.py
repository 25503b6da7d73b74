"""The ``cpu`` backend beside the pure ``reference``: the reference is the specification (pure torch, no
native kernel, a ``prepare_model`` that changes nothing), the cpu backend is the fast path, checked
against it by the conformance suite and by the engine's outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine_fixtures import PROMPTS, one_thread, require_native_kernels  # noqa: F401 - autouse

from spec_backend.backends import load_backend
from spec_backend.backends.attention import sdpa_ragged_attention
from spec_backend.backends.base import ModelOptions
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.cpu import CpuBackend
from spec_backend.cpu.attention import is_batch_invariant, mark_batch_invariant
from spec_backend.cpu.fast_path import PATH_ENV
from spec_backend.cpu.int4_linear import Int4Linear
from spec_backend.engine import LLM, SamplingParams
from spec_backend.testing import run_conformance
from spec_backend.testing.attention_checks import check_attention
from spec_backend.testing.fixtures.q4_1 import make_q4_1_model
from spec_backend.tools.tiny import make_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module", autouse=True)
def native_kernels() -> None:
    require_native_kernels()


def test_the_conformance_suite_passes_on_the_cpu_backend() -> None:
    report = run_conformance("cpu", modes=("standard", "block-lossless"), samples=4000, exact=False)
    report.assert_passed()
    assert any(c.name.startswith("attention[") for c in report.checks)


class MarkedCpu(CpuBackend):
    """The cpu backend whose attention always takes the batch-invariant rows (a packed model's)."""

    def attention_function(self):  # type: ignore[no-untyped-def]
        attention = super().attention_function()

        def marked(module: torch.nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
            mark_batch_invariant(module)
            return attention(module, *args, **kwargs)

        return marked


def test_both_attention_paths_match_the_reference() -> None:
    """Unmarked models get the reference's SDPA; packed ones the row kernel, equal within float32."""
    for backend in (CpuBackend(), MarkedCpu()):
        for result in check_attention(backend):
            result.check()


def test_the_attention_tier_has_teeth() -> None:
    """Negative control: an attention that ignores the causal rule within the query tokens fails it."""

    class NoCausal(ReferenceBackend):
        def attention_function(self):  # type: ignore[no-untyped-def]
            def wrong(module, query, key, value, mask, scaling=None, **kwargs):  # type: ignore[no-untyped-def]
                meta = kwargs["spec_attn_metadata"]
                wide = type(meta)(meta.query_lens * 0 + 1, meta.kv_lens)  # every row sees every key
                return sdpa_ragged_attention(
                    module, query, key, value, mask, scaling, spec_attn_metadata=wide
                )

            return wrong

    failed = [r for r in check_attention(NoCausal()) if not r.passed]
    windowed = {r.name for r in failed if ",W=" in r.name}  # it drops the window too: those fail, decode too
    assert windowed and failed and all("Q=1," not in r.name for r in failed if r.name not in windowed)


def test_the_reference_prepares_nothing_and_the_cpu_backend_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF Q4_1 model: the reference runs the de-quantized float32 weights as transformers loaded them
    (its greedy output is transformers' own); the cpu backend on its native path (pinned: which path runs
    is measured, ``test_fast_path.py``) packs every decoder linear (lossy, its speculative output still
    equals its plain output)."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv(PATH_ENV, "native")

    model_dir = make_q4_1_model(tmp_path / "q4", seed=3)
    reference = LLM(model_dir, backend="reference", speculative_config=NGRAM)
    assert not [m for m in reference.model.modules() if isinstance(m, Int4Linear)]
    assert all(type(m) is torch.nn.Linear for m in reference.model.modules() if hasattr(m, "in_features"))
    assert not is_batch_invariant(reference.model)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    want = [
        hf.generate(torch.tensor([p]), do_sample=False, max_new_tokens=16)[0, len(p) :].tolist()
        for p in PROMPTS
    ]
    assert [o.outputs[0].token_ids for o in reference.generate(PROMPTS, GREEDY)] == want
    fast = LLM(model_dir, backend="cpu", speculative_config=NGRAM)
    assert len([m for m in fast.model.modules() if isinstance(m, Int4Linear)]) == 14
    assert is_batch_invariant(fast.model)
    spec = [o.outputs[0].token_ids for o in fast.generate(PROMPTS, GREEDY)]
    fast.set_speculation(False)
    assert [o.outputs[0].token_ids for o in fast.generate(PROMPTS, GREEDY)] == spec


def test_float_models_give_the_references_tokens_on_the_cpu_backend(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "f", "llama", seed=1)
    outputs = [
        [
            o.outputs[0].token_ids
            for o in LLM(model, backend=name, speculative_config=NGRAM).generate(PROMPTS, GREEDY)
        ]
        for name in ("reference", "cpu")
    ]
    assert outputs[0] == outputs[1]


def test_the_options_are_passed_in_not_stashed_on_the_config(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "f", "llama"))
    before = model.config.to_dict()
    CpuBackend().prepare_model(model, ModelOptions(quantization="int8"))
    ReferenceBackend().prepare_model(model, ModelOptions())
    assert model.config.to_dict() == before


def test_the_reference_backend_imports_no_native_kernel(tmp_path: Path) -> None:
    """A whole run on the reference backend, in a fresh process: neither the cpu package nor a native
    library is imported."""
    model = make_tiny_model(tmp_path / "f", "llama")
    code = (
        "import sys, torch\n"
        "from spec_backend.engine import LLM, SamplingParams\n"
        f"llm = LLM({model!r}, backend='reference', speculative_config={NGRAM!r})\n"
        "llm.generate([[5, 6, 7, 5, 6]], SamplingParams(temperature=0.0, max_tokens=8))\n"
        "cpu = sorted(m for m in sys.modules if m.startswith('spec_backend.cpu'))\n"
        "print(cpu, torch.ops.loaded_libraries)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.strip() == "[] set()"


def test_load_backend_prefers_cpu_where_its_kernels_run() -> None:
    assert load_backend().name == "cpu" and load_backend().probe().available
