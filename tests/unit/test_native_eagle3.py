"""EAGLE-3's first draft layer as one native call (``cpu/native_eagle3``): which heads get it, its
result against transformers' modules on the same packed products, the ragged op against the general
path bit for bit with rows that never depend on the batch, and the engine's output staying the target's —
on every ISA variant of the kernels this CPU runs (``isa_fixtures``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import GREEDY, PROMPTS, draft_history, one_thread  # noqa: F401 - autouse
from isa_fixtures import VARIANTS, use_variant

from spec_backend.cpu.fast_path import PATH_ENV
from spec_backend.cpu.int4_linear import install_int4_linears
from spec_backend.cpu.native import native_op
from spec_backend.cpu.native_eagle3 import NativeEagle3Layer, install_native_eagle3_layers
from spec_backend.engine import LLM
from spec_backend.models.eagle3 import Eagle3Head, load_eagle3_head
from spec_backend.testing.fixtures.draft_checkpoints import write_eagle3
from spec_backend.testing.fixtures.q4_1 import make_q4_1_model

#: head dim 16 (the op needs a multiple of 16), every product a multiple of 16 outputs and 32 inputs
WIDE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(autouse=True, params=VARIANTS)
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on each ISA variant this CPU runs; the engine's packed path pinned to the native one."""
    monkeypatch.setenv(PATH_ENV, "native")
    return use_variant(str(request.param), monkeypatch)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_q4_1_model(tmp_path_factory.mktemp("wide"), "llama", 5, **WIDE)


def _head(
    target_dir: str, path: Path, quantize: bool = True, norm_before_residual: bool = False
) -> Eagle3Head:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    folder = write_eagle3(path, target_dir, "speculators", 96, [0, 1, 2], norm_before_residual, seed=3)
    head = load_eagle3_head(folder, target, "sdpa", torch.float32)
    if quantize:
        assert install_int4_linears(head, quantize=True) == 9
    return head


def test_packed_heads_get_the_native_layer_and_others_do_not(
    target_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _head(target_dir, tmp_path / "a")
    assert install_native_eagle3_layers(head) == 1
    assert isinstance(head.layers[0], NativeEagle3Layer)
    assert install_native_eagle3_layers(_head(target_dir, tmp_path / "b", quantize=False)) == 0  # float
    tiny = make_q4_1_model(tmp_path / "narrow", "llama", 5)  # head dim 8: outside the op's range
    assert install_native_eagle3_layers(_head(tiny, tmp_path / "c")) == 0
    monkeypatch.setenv("SPEC_BACKEND_NATIVE_LAYERS", "0")
    assert install_native_eagle3_layers(_head(target_dir, tmp_path / "d")) == 0


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_native_layer_is_close_to_transformers_modules(
    target_dir: str, tmp_path: Path, norm_before_residual: bool
) -> None:
    """A prefill of 6 rows, then 2 one-row drafts, on transformers' cache (the general path): the same
    packed products, norms and rotary embedding differing in the last bits; noise floor 2^-8 of the
    outputs' spread (as ``test_native_layer``'s)."""
    from transformers import DynamicCache

    reference = _head(target_dir, tmp_path / "h", norm_before_residual=norm_before_residual)
    native = copy.deepcopy(reference)
    assert install_native_eagle3_layers(native) == 1
    gen = torch.Generator().manual_seed(11)
    ids, g = torch.randint(0, 128, (1, 6), generator=gen), torch.randn(1, 6, 64, generator=gen)  # [1, 6, H]
    caches = (DynamicCache(), DynamicCache())
    outs: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    for step, rows in enumerate([slice(0, 6), slice(5, 6), slice(5, 6)]):
        positions = torch.arange(rows.start, rows.stop)[None] + step
        for head, cache, out in zip((reference, native), caches, outs, strict=True):
            hidden = g[:, rows] if step == 0 else out[-1][:, -1:]
            with torch.no_grad():
                out.append(head(ids[:, rows], hidden, positions, cache, None))  # [1, Q, H]
    for ref, got in zip(*outs, strict=True):
        assert float((got - ref).abs().max()) < float(ref.std()) * 2**-8
    assert float((outs[0][0] - outs[0][1][:, -1:]).abs().max()) > 0  # the rows differ: a real comparison


def test_ragged_op_equals_the_general_path_and_ignores_the_batch(target_dir: str, tmp_path: Path) -> None:
    """Request A feeds 3 rows at positions 4..6 beside request B's one row (2 padding rows): each equals
    that request computed alone, and the general path's ops around the row attention kernel give the
    same rows and cache bit for bit."""
    head = _head(target_dir, tmp_path / "h", norm_before_residual=True)
    assert install_native_eagle3_layers(head) == 1
    layer: Any = head.layers[0]
    names = ("eagle3_layer", "eagle3_layer_qkv", "attention_rows", "decoder_layer_out")
    ops, shape = {name: native_op(name) for name in names}, (*layer.shape, layer.self_attn.scaling, True)
    gen = torch.Generator().manual_seed(12)
    e, g = torch.randn(2, 3, 64, generator=gen), torch.randn(2, 3, 64, generator=gen)  # [B, Q, H]
    cos, sin = head.rotary_emb(g, torch.tensor([[4, 5, 6], [1, 2, 3]]))  # [B, Q, D]
    cache = torch.randn(2, 2, 2, 10, 16, generator=gen)  # k|v, [B, Hkv, C, D]
    weights = (layer.hidden_norm, layer._weights)

    def run(b: slice, q_lens: list[int], kv_lens: list[int], kv: torch.Tensor) -> Any:
        lens = (torch.tensor(q_lens), torch.tensor(kv_lens))
        return ops["eagle3_layer"](
            e[b], g[b], weights[0], cos[b], sin[b], weights[1], kv[0, b], kv[1, b], *lens, *shape
        )

    batched_kv, alone_kv = cache.clone(), cache.clone()
    batched = run(slice(None), [3, 1], [7, 2], batched_kv)  # [2, 3, H]
    assert torch.equal(run(slice(0, 1), [3], [7], alone_kv)[0], batched[0])
    assert torch.equal(run(slice(1, 2), [1], [2], alone_kv)[0, 0], batched[1, 0])
    assert torch.equal(alone_kv, batched_kv) and not torch.equal(batched_kv, cache)

    general_kv = cache.clone()
    q, k, v, residual = ops["eagle3_layer_qkv"](e, g, weights[0], cos, sin, weights[1], *shape[:4], True)
    general_kv[0, 0, :, 4:7], general_kv[1, 0, :, 4:7] = k[0], v[0]
    general_kv[0, 1, :, 1:2], general_kv[1, 1, :, 1:2] = k[1, :, :1], v[1, :, :1]
    attn = ops["attention_rows"](
        q, general_kv[0], general_kv[1], torch.tensor([3, 1]), torch.tensor([7, 2]), shape[4]
    )
    general = ops["decoder_layer_out"](residual, attn, weights[1], *shape[:4])
    assert torch.equal(general[0], batched[0]) and torch.equal(general[1, 0], batched[1, 0])
    assert torch.equal(general_kv, batched_kv)
    with pytest.raises(RuntimeError, match=r"hidden_norm must be contiguous float32 \[64\], got \[32\]"):
        ops["eagle3_layer_qkv"](e, g, weights[0][:32], cos, sin, weights[1], *shape[:4], True)
    with pytest.raises(RuntimeError, match=r"embeds must be float32 \[2, 3, 64\] like hidden"):
        ops["eagle3_layer_qkv"](e[:1], g, weights[0], cos, sin, weights[1], *shape[:4], True)


def test_engine_drafts_natively_and_stays_lossless(target_dir: str, tmp_path: Path) -> None:
    """The engine installs the native layer for an int4 head: every step's drafts equal those of
    transformers' modules on the same products (``SPEC_BACKEND_NATIVE_LAYERS=0``), and the output is the
    target's plain greedy output."""
    folder = write_eagle3(tmp_path / "h", target_dir, "speculators", 96, [0, 1, 2], seed=3)
    spec = {
        "adaptive_draft_length": False,
        "method": "eagle3",
        "model": folder,
        "num_speculative_tokens": 3,
        "quantization": "int4",
    }
    llm = LLM(target_dir, speculative_config=spec)
    drafter: Any = llm.engine.drafter
    assert isinstance(drafter.head.layers[0], NativeEagle3Layer)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPEC_BACKEND_NATIVE_LAYERS", "0")
        modules = LLM(target_dir, speculative_config=spec)
    modules_drafter: Any = modules.engine.drafter
    assert not isinstance(modules_drafter.head.layers[0], NativeEagle3Layer)
    speculative = []
    for prompt in PROMPTS:
        tokens, drafts = draft_history(llm, prompt, 16)
        assert (tokens, drafts) == draft_history(modules, prompt, 16)
        assert len(drafts) >= 5 and len({d for step in drafts for d in step[1]}) > 3  # drafts vary
        speculative.append(tokens[len(prompt) :])
    llm.set_speculation(False)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == speculative
