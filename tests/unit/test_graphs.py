"""plan_capture_sizes: multiples of K+1, rounding, caps, fallback and budget subsampling."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from spec_backend_ascend import AscendBackend, StreamLedger

from spec_backend.backends.reference import ReferenceBackend
from spec_backend.graphs import padded_size, plan_capture_sizes, subsample_evenly


def test_default_ladder_in_request_units() -> None:
    # K=3 -> step 4; 40 requests -> 1,2,4,8,16,24,32,40 requests
    assert plan_capture_sizes(3, 40) == [4, 8, 16, 32, 64, 96, 128, 160]


def test_requested_sizes_rounded_up_and_capped() -> None:
    assert plan_capture_sizes(4, 8, requested=[1, 5, 6, 11, 100]) == [5, 10, 15]  # 100 > cap 40 dropped
    assert plan_capture_sizes(4, 8, requested=[7, 8, 9]) == [10]  # duplicates after rounding collapse


def test_caps_by_batched_tokens_and_backend() -> None:
    assert plan_capture_sizes(1, 1000, max_num_batched_tokens=20) == [2, 4, 8, 16, 20]
    big = plan_capture_sizes(0, 4096, backend=ReferenceBackend())
    assert max(big) == 512


def test_fallback_is_one_request() -> None:
    assert plan_capture_sizes(7, 4, requested=[100]) == [8]
    assert plan_capture_sizes(7, 4, max_num_batched_tokens=3) == [8]


def test_ascend_budget_subsamples_keeping_ends() -> None:
    backend = AscendBackend()
    backend.streams = StreamLedger(total=5)  # 5 streams left: 5 whole-forward graphs
    sizes = plan_capture_sizes(15, 256, backend=backend, num_hidden_layers=300)
    assert len(sizes) == backend.capture_policy().graph_budget == 5
    assert sizes[0] == 16 and sizes[-1] == 512
    assert all(s % 16 == 0 for s in sizes)


def test_subsample_evenly() -> None:
    assert subsample_evenly([1, 2, 3, 4, 5, 6, 7, 8, 9], 3) == [1, 5, 9]
    assert subsample_evenly([1, 2, 3], 5) == [1, 2, 3]
    assert subsample_evenly([1, 2, 3], 1) == [3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_speculative_tokens": -1, "max_num_seqs": 4}, r"num_speculative_tokens must be >= 0, got -1"),
        ({"num_speculative_tokens": True, "max_num_seqs": 4}, r"num_speculative_tokens must be an integer"),
        ({"num_speculative_tokens": 2, "max_num_seqs": 0}, r"max_num_seqs must be a positive integer, got 0"),
        ({"num_speculative_tokens": 2, "max_num_seqs": 4, "requested": [0]}, r"requested capture size"),
        (
            {"num_speculative_tokens": 2, "max_num_seqs": 4, "max_num_batched_tokens": -5},
            r"max_num_batched_tokens must be a positive integer, got -5",
        ),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_capture_sizes(**kwargs)  # type: ignore[arg-type]


@given(
    k=st.integers(0, 20),
    seqs=st.integers(1, 300),
    batched=st.one_of(st.none(), st.integers(1, 5000)),
    requested=st.one_of(st.none(), st.lists(st.integers(1, 3000), max_size=20)),
    layers=st.integers(1, 200),
)
def test_plan_properties(
    k: int, seqs: int, batched: int | None, requested: list[int] | None, layers: int
) -> None:
    backend = AscendBackend()
    sizes = plan_capture_sizes(k, seqs, batched, requested, backend=backend, num_hidden_layers=layers)
    step = k + 1
    assert sizes == sorted(set(sizes)) and sizes
    assert all(s % step == 0 for s in sizes)
    cap = min(seqs * step, batched or 10**9, 512)
    assert sizes == [step] or all(s <= cap for s in sizes)
    assert len(sizes) <= backend.capture_policy(layers).graph_budget  # type: ignore[operator]


def test_padded_size_and_eager_runner() -> None:
    assert padded_size(5, [4, 8, 16]) == 8
    assert padded_size(17, [4, 8, 16]) is None
    runner = ReferenceBackend().graph_runner(lambda x: x * 2, [4, 8])
    runner.capture({"x": torch.zeros(8)})
    assert torch.equal(runner.run({"x": torch.arange(3.0)}), torch.tensor([0.0, 2.0, 4.0]))
