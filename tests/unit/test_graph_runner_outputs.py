"""PaddedGraphRunner with a callable that returns a tuple of tensors (simulated driver, CPU): every output
is padded, replayed, sliced back to the real token count and copied; eager fallback returns the
callable's own tuple; a mixed or mis-sized output is refused naming it."""

from __future__ import annotations

import pytest
import torch

from spec_backend.backends.graph_common import PaddedGraphRunner, SimulatedGraphDriver, slice_outputs


def _two_outputs(calls: list[int]) -> object:
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [N, 3], [N] ->
        calls.append(x.shape[0])
        return x * w[:, None] + 1, (x.sum(-1) * w).to(torch.int64)  # [N, 3] float, [N] int64

    return fn


def _runner(sizes: list[int], copy_output: bool = True) -> tuple[PaddedGraphRunner, list[int]]:
    calls: list[int] = []
    runner = PaddedGraphRunner(
        _two_outputs(calls),  # type: ignore[arg-type]
        sizes,
        SimulatedGraphDriver(),
        progress=False,
        copy_output=copy_output,
    )
    return runner, calls


def _inputs(n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"x": torch.randint(0, 5, (n, 3), generator=gen).float(), "w": torch.rand(n, generator=gen)}


def _expected(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    out = _two_outputs([])(**inputs)  # type: ignore[operator]
    assert isinstance(out, tuple)
    return out


def test_tuple_outputs_are_padded_replayed_and_sliced() -> None:
    runner, _ = _runner([4, 8])
    runner.capture(_inputs(8, 0))
    assert runner.captured_sizes == (4, 8)
    for n in (1, 3, 4, 5, 8):
        inputs = _inputs(n, n)
        out = runner.run(inputs)
        assert isinstance(out, tuple) and len(out) == 2
        want = _expected(inputs)
        assert [tuple(t.shape) for t in out] == [(n, 3), (n,)]
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
        assert out[1].dtype == torch.int64
    assert runner.replays == 5 and runner.eager_calls == 0


def test_tuple_outputs_fall_back_to_eager_above_the_largest_size_and_before_capture() -> None:
    runner, calls = _runner([4])
    before = runner.run(_inputs(3, 1))  # not captured yet: eager at the real size
    assert isinstance(before, tuple) and calls == [3] and runner.eager_calls == 1
    runner.capture(_inputs(4, 0))
    calls.clear()
    inputs = _inputs(9, 2)
    out = runner.run(inputs)
    assert isinstance(out, tuple) and calls == [9] and runner.eager_calls == 2
    assert all(torch.equal(a, b) for a, b in zip(out, _expected(inputs), strict=True))


def test_tuple_outputs_are_copies_unless_asked_otherwise() -> None:
    runner, _ = _runner([4])
    runner.capture(_inputs(4, 0))
    first = runner.run(_inputs(2, 3))
    kept = tuple(t.clone() for t in first)
    runner.run(_inputs(2, 4))  # the next replay overwrites the static outputs, not the copies
    assert all(torch.equal(a, b) for a, b in zip(first, kept, strict=True))
    views, _ = _runner([4], copy_output=False)
    views.capture(_inputs(4, 0))
    shared = views.run(_inputs(2, 3))
    later = _inputs(2, 4)
    views.run(later)
    assert all(torch.equal(a, b) for a, b in zip(shared, _expected(later), strict=True))  # overwritten


def test_every_output_of_a_simulated_graph_is_rewritten_on_replay() -> None:
    runner, _ = _runner([4])
    runner.capture(_inputs(4, 0))
    for seed in (5, 6):
        inputs = _inputs(4, seed)
        out = runner.run(inputs)
        want = _expected(inputs)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])  # both, not only the first


@pytest.mark.parametrize(
    ("fn", "error", "match"),
    [
        (
            lambda x: (x, x[:1]),
            ValueError,
            r"output 1's leading dimension must be the token count 4, got shape \[1\]",
        ),
        (lambda x: (), TypeError, r"one tensor or a non-empty tuple of tensors, got tuple\(\)"),
        (lambda x: {"a": x}, TypeError, r"non-empty tuple of tensors, got dict"),
    ],
)
def test_bad_outputs_are_named(fn: object, error: type[Exception], match: str) -> None:
    runner = PaddedGraphRunner(fn, [4], SimulatedGraphDriver(), progress=False)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        runner.capture({"x": torch.zeros(4)})


def test_slice_outputs_keeps_the_structure() -> None:
    a, b = torch.arange(6.0), torch.arange(12).view(6, 2)
    one = slice_outputs(a, 2, copy=False)
    assert isinstance(one, torch.Tensor) and one.data_ptr() == a.data_ptr() and one.shape == (2,)
    pair = slice_outputs((a, b), 3, copy=True)
    assert isinstance(pair, tuple) and [t.shape[0] for t in pair] == [3, 3]
    assert pair[1].data_ptr() != b.data_ptr()


def test_shared_inputs_are_the_callers_tensor_for_every_runner() -> None:
    """Two runners capture with ``shared=("x",)`` over one tensor: their static ``x`` is that tensor (not
    a clone each), a caller writes a step's rows into it once and passes the view, and either runner
    replays on them with the padding rows zeroed; unshared inputs stay clones. A shared name that is not
    an input is refused by name."""
    x = torch.zeros(8, 3)
    runners = [_runner([4, 8])[0] for _ in range(2)]
    for runner in runners:
        runner.capture({"x": x, "w": torch.zeros(8)}, shared=("x",))
        assert runner.static_inputs["x"].data_ptr() == x.data_ptr()
    assert runners[0].static_inputs["w"].data_ptr() != runners[1].static_inputs["w"].data_ptr()
    x.fill_(7.0)  # stale rows from a wider step: the padding must not see them
    for n, size, runner in zip((3, 5), (4, 8), runners, strict=True):
        inputs = _inputs(n, n)
        x[:n].copy_(inputs["x"])
        out = runner.run({"x": x[:n], "w": inputs["w"]})
        want = _expected(inputs)
        assert isinstance(out, tuple) and torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
        assert not x[n:size].any()  # padded rows zeroed in the shared buffer itself
    with pytest.raises(ValueError, match=r"shared inputs \['y'\] are not among the example inputs"):
        _runner([4])[0].capture({"x": torch.zeros(4, 3), "w": torch.zeros(4)}, shared=("y",))
