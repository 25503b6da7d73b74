"""GGUF k-quant and Q8_0 blocks read from the file (``cpu/gguf_blocks``) and run on the k8 kernel
(``cpu/kquant_linear``): every decoder against the ``gguf`` package's de-quantizers on blocks in the file
format, the rotary row order transformers gives q/k, refusal of tensors that do not re-create the loaded
weight, and the kernel against a float64 product (not lossy) with rows independent of the batch, on every
ISA variant this CPU runs (``isa_fixtures``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_fixtures import require_native_kernels
from isa_fixtures import VARIANTS, use_variant
from torch import nn

from spec_backend.cpu.gguf_blocks import BLOCK_BYTES, decode, match_rows, rotary_unpermute
from spec_backend.cpu.kquant_linear import K8Linear, install_k8_linears
from spec_backend.tools.tiny_gguf import random_blocks

KINDS = sorted(BLOCK_BYTES)


@pytest.fixture(params=VARIANTS)
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ISA variant of this instance's kernel (``isa_fixtures``)."""
    require_native_kernels()
    return use_variant(str(request.param), monkeypatch)


@pytest.mark.parametrize("kind", KINDS)
def test_decoded_blocks_equal_the_gguf_packages_dequantization(kind: str) -> None:
    """Random bytes (every bit of every code, scale and minimum field random; fp16 scales set to finite
    values) decode to exactly the weights ``gguf.quants.dequantize`` gives, and the codes are in the
    type's range."""
    from gguf import GGMLQuantizationType, quants

    raw = random_blocks(kind, 6, 512, np.random.default_rng(7))
    decoded = decode(kind, raw, 6, 512)
    expected = quants.dequantize(raw, GGMLQuantizationType[kind])  # [6, 512]
    assert torch.equal(decoded.weights(), torch.from_numpy(expected))
    ranges = {"Q4_K": (0, 15), "Q5_K": (0, 31), "Q6_K": (-32, 31), "Q8_0": (-127, 127)}
    ranges.update({"Q4_0": (-8, 7), "Q5_0": (-16, 15), "Q5_1": (0, 31)})
    low, high = ranges[kind]
    assert int(decoded.codes.min()) >= low and int(decoded.codes.max()) <= high
    assert decoded.group == (16 if kind == "Q6_K" else 32)


def test_decode_refuses_bad_shapes_and_types() -> None:
    raw = random_blocks("Q4_K", 2, 256, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"GGUF type must be one of .*got 'Q3_K'"):
        decode("Q3_K", raw, 2, 256)
    with pytest.raises(ValueError, match="a Q4_K row holds a multiple of 256 weights, got 128"):
        decode("Q4_K", raw, 4, 128)
    with pytest.raises(ValueError, match=r"Q4_K \[3, 256\] needs 432 bytes, got 288"):
        decode("Q4_K", raw, 3, 256)


def test_rotary_rows_are_matched_and_a_wrong_weight_is_refused() -> None:
    """llama.cpp's converter stores a q projection's rows permuted per head; transformers undoes it. The
    decoded tensor is reordered to the loaded weight, and a weight it does not re-create gets ``None``."""
    heads, rows = 4, 64
    decoded = decode("Q6_K", random_blocks("Q6_K", rows, 256, np.random.default_rng(1)), rows, 256)
    in_file = decoded.weights()  # [64, 256] the file's row order
    loaded = in_file[rotary_unpermute(rows, heads)]  # what transformers' loader makes of it
    # the converter's permutation (per head: [2, dim/2] -> [dim/2, 2]) maps the loaded rows back to the file's
    assert torch.equal(
        loaded.reshape(heads, 2, rows // heads // 2, 256).transpose(1, 2).reshape(rows, 256), in_file
    )
    matched = match_rows(decoded, loaded, (8, heads))
    assert matched is not None and torch.equal(matched.weights(), loaded)
    assert match_rows(decoded, in_file, (heads,)) is decoded  # a tensor stored as loaded keeps its order
    other = loaded.clone()
    other[5, 7] += 1e-3  # one weight the file does not hold
    assert match_rows(decoded, other, (heads,)) is None
    assert match_rows(decoded, loaded[:, :128], (heads,)) is None  # another shape


def _layer(kind: str, n: int, k: int, seed: int) -> tuple[K8Linear, torch.Tensor]:
    decoded = decode(kind, random_blocks(kind, n, k, np.random.default_rng(seed)), n, k)
    linear = nn.Linear(k, n, bias=False)
    linear.weight.data = decoded.weights()
    return K8Linear(linear, decoded), decoded.weights()


@pytest.mark.parametrize("kind", KINDS)
def test_k8_kernel_equals_the_float_product_up_to_summation_order(isa: str, kind: str) -> None:
    """Noise floor: float32 accumulation of K = 512 products, |error| <= K·2^-24 of sum |x_i w_i| (2^-15);
    the bound is 2^-14. Negative control: activations rounded to bfloat16 (torch's packed kernels) break
    it, so the bound tells an exact kernel from a lossy one."""
    layer, weight = _layer(kind, 48, 512, seed=2)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(3))  # [M, K]
    got = layer(x)  # [M, N]
    ref = x.double() @ weight.double().T
    bound = (x.abs().double() @ weight.abs().double().T) * 2**-14
    assert got.dtype == torch.float32 and got.shape == (5, 48)
    assert ((got.double() - ref).abs() <= bound).all()
    lossy = x.to(torch.bfloat16).double() @ weight.double().T
    assert not ((lossy - ref).abs() <= bound).all()


def test_k8_rows_do_not_depend_on_the_batch(isa: str) -> None:
    """Rows are bit-identical alone and in batches of 1..19 (tiles of 8 and their remainders)."""
    layer, _ = _layer("Q5_K", 40, 256, seed=4)
    x = torch.randn(19, 256, generator=torch.Generator().manual_seed(5))  # [M, K]
    alone = torch.cat([layer(x[i : i + 1]) for i in range(19)])  # [M, N]
    for m in range(1, 20):
        assert torch.equal(layer(x[:m].contiguous()), alone[:m]), m


def test_k8_kernel_refuses_bad_inputs(isa: str) -> None:
    layer, _ = _layer("Q6_K", 16, 256, seed=6)
    op = layer._op
    with pytest.raises(RuntimeError, match="scale and low must be contiguous float32"):
        op(torch.zeros(2, 256), layer.codes, layer.scale[:, :4].contiguous(), layer.low)
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        op(torch.zeros(2, 40), layer.codes, layer.scale, layer.low)


def test_only_layers_with_blocks_are_replaced() -> None:
    require_native_kernels()
    model = nn.Sequential(nn.Linear(256, 16, bias=False), nn.Linear(256, 16, bias=False))
    decoded = decode("Q8_0", random_blocks("Q8_0", 16, 256, np.random.default_rng(8)), 16, 256)
    model[0].weight.data = decoded.weights()
    assert install_k8_linears(model, {id(model[0].weight): decoded}) == 1
    assert isinstance(model[0], K8Linear) and type(model[1]) is nn.Linear
    assert not hasattr(model[0], "weight")  # the codes replace the float weight
    with pytest.raises(
        ValueError, match=r"decoded Q8_0 codes must be \[out, in\] = \[16, 512\], got \[16, 256\]"
    ):
        K8Linear(nn.Linear(512, 16), decoded)


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0"])
def test_types_without_offsets_keep_one_scale_per_32(isa: str, kind: str) -> None:
    """Q8_0 and Q5_0 (``w = d·q``) keep the kernel's Q8_0 form, 9 bits per weight instead of 12, with the
    same exactness and the same bits as the per-16 form of the same weights."""
    layer, weight = _layer(kind, 32, 256, seed=9)
    assert layer.scale.shape == (32, 8) and layer.low.numel() == 0
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(10))  # [M, K]
    per16 = layer._op(x, layer.codes, layer.scale.repeat_interleave(2, dim=1), torch.zeros(32, 16))
    assert torch.equal(layer(x), per16)
    bound = (x.abs().double() @ weight.abs().double().T) * 2**-14
    assert ((layer(x).double() - x.double() @ weight.double().T).abs() <= bound).all()
