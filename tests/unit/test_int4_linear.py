"""GGUF Q4_1 layers kept packed (``cpu/int4_linear``): exact recovery of the blocks from their
de-quantized floats, refusal of anything else, each kernel's error against the float32 layer (torch's, and
ours on every ISA variant this CPU runs), and the engine's guarantee on a prepared model (speculative
greedy = plain greedy, token for token)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_fixtures import PROMPTS, check_speculation_is_lossless, one_thread  # noqa: F401 - autouse
from isa_fixtures import VARIANTS, use_variant

from spec_backend.cpu.attention import is_batch_invariant
from spec_backend.cpu.fast_path import PATH_ENV
from spec_backend.cpu.int4_linear import Int4Linear, install_int4_linears, q4_1_tiles, recover_q4_1
from spec_backend.cpu.isa import variant
from spec_backend.cpu.native import active_variant
from spec_backend.engine import LLM
from spec_backend.testing.fixtures.q4_1 import make_q4_1_model, q4_1_round_trip
from spec_backend.tools.tiny import make_tiny_model


def _q4_1(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return q4_1_round_trip(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1)


def test_q4_1_blocks_are_recovered_exactly() -> None:
    w = _q4_1(48, 96)
    found = recover_q4_1(w)
    assert found is not None
    codes, scale, low = found
    assert codes.shape == (48, 96) and scale.shape == low.shape == (48, 3)
    assert int(codes.min()) == 0 and int(codes.max()) == 15
    rebuilt = codes.reshape(48, 3, 32).float() * scale[..., None] + low[..., None]
    assert torch.equal(rebuilt.reshape(48, 96), w)


def test_anything_else_is_left_alone() -> None:
    assert recover_q4_1(torch.randn(16, 64)) is None  # a float weight
    w = _q4_1(16, 64)
    w[3, 5] += 1e-4  # one weight off its block's grid
    assert recover_q4_1(w) is None
    assert recover_q4_1(_q4_1(16, 64).double()) is None  # only float32 layers
    assert recover_q4_1(torch.randn(16, 40)) is None  # K not a multiple of 32


#: torch's kernel, and ours on each ISA variant (an instance skips where this CPU cannot run it)
KERNELS = ["torch", *VARIANTS]


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``"torch"``, or ``"native"`` with the parameter's ISA variant selected."""
    if request.param == "torch":
        return "torch"
    use_variant(str(request.param), monkeypatch)
    return "native"


def _packed(kernel: str, n: int = 64, k: int = 128) -> tuple[torch.nn.Linear, Int4Linear]:
    linear = torch.nn.Linear(k, n, bias=True)
    with torch.no_grad():
        linear.weight.copy_(_q4_1(n, k, seed=1))
    found = recover_q4_1(linear.weight)
    assert found is not None
    packed = Int4Linear(linear, *found, kernel=kernel)
    assert packed.kernel == kernel
    return linear, packed


def _noise_floor(kernel: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """torch: activations, scales and zeros are rounded to bfloat16 (relative 2^-9) and the output too, so
    an output may differ from float32 by ~2^-8 of the sum of |x_i w_i|; the bound is 2^-7. native: each
    activation moves by at most half its block's step (block max / 254), so an output moves by at most
    sum over blocks of that times the block's sum of |w_i|, plus float32 accumulation (2^-14 of the sum
    of |x_i w_i|)."""
    magnitude = (x.abs() @ w.abs().T) + bias.abs()  # [rows, N]
    if kernel == "torch":
        return magnitude * 2**-7
    steps = x.abs().reshape(x.shape[0], -1, 32).amax(dim=-1) / 254  # [rows, G]
    return steps.repeat_interleave(32, dim=1) @ w.abs().T + magnitude * 2**-14  # [rows, N]


@pytest.mark.parametrize("rows", [1, 3, 8, 64])
def test_kernel_matches_the_float_layer_within_its_rounding(kernel: str, rows: int) -> None:
    linear, packed = _packed(kernel)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, ref = packed(x), linear(x)
        bound = _noise_floor(kernel, x, linear.weight, linear.bias)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert ((got - ref).abs() <= bound).all()
    assert not torch.equal(got, ref)  # lossy, as documented (a kernel that ignored the rounding would pass)


def test_rows_do_not_depend_on_the_batch(kernel: str) -> None:
    """Each row bit-identical alone and in batches of 1..9 (the native kernel's tiles of 5 rows and their
    remainders): what speculative greedy output equal to plain greedy output rests on."""
    _, packed = _packed(kernel)
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(3))  # [M, K]
    with torch.no_grad():
        alone = torch.cat([packed(x[i : i + 1]) for i in range(9)])  # [M, N]
        for m in range(1, 10):
            assert torch.equal(packed(x[:m]), alone[:m]), m


@pytest.mark.parametrize("isa", VARIANTS)
def test_float16_scales_give_the_float32_scales_bits(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_1 layer's scales and minima are float16 values (the file stores them so): the tiles keep them
    as float16 (a fifth fewer bytes per weight) and every output equals, bit for bit, the kernel's with
    the same values as float32. Scales that are not float16 values (a Q4_K block's are products of two
    scales) stay float32: rounding them to float16 would change the outputs (negative control). The
    generic variant, which converts float16 in software (slower than reading float32), keeps float32."""
    use_variant(isa, monkeypatch)
    _, packed = _packed("native")
    kept = torch.float16 if variant(isa).half_scales else torch.float32  # generic: converts in software
    assert packed.tile_scale.dtype == packed.tile_low.dtype == kept
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(5))  # [M, K]
    op, scale, low = packed._op, packed.tile_scale.half(), packed.tile_low.half()
    assert op is not None
    with torch.no_grad():
        assert torch.equal(op(x, packed.tiles, scale, low), op(x, packed.tiles, scale.float(), low.float()))
    found = recover_q4_1(_q4_1(64, 128, seed=1))
    assert found is not None
    codes, q4_scale, q4_low = found
    wide = q4_scale * (1 + 2**-14)  # [N, G]: no longer float16 values
    kept = Int4Linear(torch.nn.Linear(128, 64, bias=False), codes, wide, q4_low, kernel="native")
    assert kept.tile_scale.dtype == kept.tile_low.dtype == torch.float32
    assert kept._op is not None
    with torch.no_grad():
        exact = kept._op(x, kept.tiles, kept.tile_scale, kept.tile_low)
        rounded = kept._op(x, kept.tiles, kept.tile_scale.half(), kept.tile_low.half())
    assert not torch.equal(exact, rounded)
    with pytest.raises(RuntimeError, match=r"both float32 or both float16, got Half .* and Float"):
        op(x, packed.tiles, scale, low.float())


def test_tile_layout_follows_the_glossary() -> None:
    codes = torch.randint(0, 16, (32, 64), generator=torch.Generator().manual_seed(4), dtype=torch.int32)
    tiles = q4_1_tiles(codes)  # [N/16, G, 256]
    assert tiles.shape == (2, 2, 256) and tiles.dtype == torch.uint8
    for t, g, c, j, b in [(0, 0, 0, 0, 0), (1, 1, 3, 15, 3), (0, 1, 2, 7, 1), (1, 0, 1, 9, 2)]:
        byte = int(tiles[t, g, 64 * c + 4 * j + b])
        assert byte & 15 == int(codes[16 * t + j, 32 * g + 4 * c + b])
        assert byte >> 4 == int(codes[16 * t + j, 32 * g + 16 + 4 * c + b])


def test_kernel_choice_is_checked() -> None:
    linear = torch.nn.Linear(64, 8)
    found = recover_q4_1(_q4_1(8, 64))
    assert found is not None
    with pytest.raises(ValueError, match="kernel must be None, 'native' or 'torch', got 'fast'"):
        Int4Linear(linear, *found, kernel="fast")
    with pytest.raises(ValueError, match=r"kernel='native' needs .* N % 16 == 0 \(N=8\)"):
        Int4Linear(linear, *found, kernel="native")


def test_the_engine_packs_q4_1_models_and_stays_lossless(
    kernel: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each packed path pinned (``cpu/fast_path``: the measurement would pick one), on each ISA variant."""
    monkeypatch.setenv(PATH_ENV, "native" if kernel == "native" else "int4-bf16")
    model_dir = make_q4_1_model(tmp_path / "q4", seed=3)
    llm = LLM(
        model_dir,
        speculative_config={
            "adaptive_draft_length": False,
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
        },
    )
    packed = [m for m in llm.model.modules() if isinstance(m, Int4Linear)]
    assert len(packed) == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
    assert {m.kernel for m in packed} == {kernel}
    selected = active_variant()
    assert selected is not None and {m.isa for m in packed} == {selected.name if kernel == "native" else ""}
    check_speculation_is_lossless(llm)
    assert is_batch_invariant(llm.model)  # the attention keeps rows independent of the batch


def test_logits_stay_close_to_the_float_model(tmp_path: Path) -> None:
    """The prepared model against transformers' float32 reading of the same weights; noise floor
    2^-5 of the logits' spread (the bfloat16 roundings of ``test_kernel_matches...`` through 2 layers)."""
    from transformers import AutoModelForCausalLM

    model_dir = make_q4_1_model(tmp_path / "q4", seed=3)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    packed = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert install_int4_linears(packed) == 14
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        ref, got = reference(ids).logits, packed(ids).logits  # [1, T, V]
    spread = float(ref.std())
    assert float((got - ref).abs().max()) < spread * 2**-5
    assert not torch.equal(got, ref)


def test_float_models_are_not_packed(tmp_path: Path) -> None:
    llm = LLM(make_tiny_model(tmp_path / "f", "llama"))
    assert not [m for m in llm.model.modules() if isinstance(m, Int4Linear)]


def test_packing_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_BACKEND_INT4", "0")
    llm = LLM(make_q4_1_model(tmp_path / "q4", seed=3))
    assert not [m for m in llm.model.modules() if isinstance(m, Int4Linear)]
