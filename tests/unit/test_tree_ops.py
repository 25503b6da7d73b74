"""``SamplerOps.tree_verify`` (#42): the batched tree op in torch (point masses, and sampled siblings with
``draft_probs``) equals the per-tree reference ``sampling.tree_verify`` on the same uniforms, and the
triton op (interpreted here, compiled on a GPU) equals the torch op — random trees with repeated sibling
tokens, zero-probability tokens, greedy and sampled requests, padded batches and vocabularies spanning
several blocks."""

from __future__ import annotations

import random

import pytest
import torch

from spec_backend.sampling.tree_ops import NO_NODE, TorchTreeOps
from spec_backend.sampling.tree_verify import verify_tree, verify_tree_greedy
from spec_backend.sampling.tuning import SamplerTuning

V = 40


def _batch(seed: int, batch: int = 6, m: int = 7, full: int = 0) -> dict[str, torch.Tensor | None]:
    """Random trees whose nodes are mostly among their parent's three most likely tokens (so that
    rejected siblings carry real mass), some repeating an earlier sibling's token; every ``full``-th
    request (0: none) has all ``m`` nodes."""
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    counts = [m if full and b % full == full - 1 else rnd.randrange(0, m + 1) for b in range(batch)]
    starts = [sum(1 + c for c in counts[:b]) for b in range(batch)]
    logits = torch.randn(sum(counts) + batch, V, generator=gen, dtype=torch.float64) * 3.0
    logits[torch.rand(logits.shape, generator=gen) < 0.3] = float("-inf")  # top-k / top-p style zeros
    logits[:, 0] = 0.0  # every row keeps some mass
    probs = torch.softmax(logits, -1).float()  # [N, V]
    parents = torch.full((batch, m), NO_NODE, dtype=torch.int64)
    tokens = torch.zeros((batch, m), dtype=torch.int64)
    for b, n in enumerate(counts):
        for i in range(n):
            parents[b, i] = parent = rnd.randrange(-1, i)
            siblings = [int(tokens[b, j]) for j in range(i) if parents[b, j] == parent]
            likely = torch.argsort(probs[starts[b] + 1 + parent], descending=True)[:3].tolist()
            if siblings and rnd.random() < 0.25:  # a child repeating an earlier sibling's token
                tokens[b, i] = rnd.choice(siblings)
            else:
                tokens[b, i] = rnd.choice(likely) if rnd.random() < 0.8 else rnd.randrange(V)
    return {
        "parents": parents,
        "tokens": tokens,
        "target_probs": probs,
        "target_argmax": probs.argmax(-1),
        "row_start": torch.tensor(starts, dtype=torch.int64),
        "greedy": torch.rand(batch, generator=gen) < 0.3,
        "uniforms": torch.rand(batch, m + 1, generator=gen, dtype=torch.float64),
    }


def _check_against_the_reference(inputs: dict[str, torch.Tensor | None], seed: int) -> None:
    """The batched torch op's path and final token of every request equal ``sampling.tree_verify``'s on
    that request alone (point masses without ``draft_probs``)."""
    path, final = TorchTreeOps().tree_verify(**inputs)  # type: ignore[arg-type]
    parents, tokens, probs, q = (inputs.get(k) for k in ("parents", "tokens", "target_probs", "draft_probs"))
    assert parents is not None and tokens is not None and probs is not None
    for b in range(parents.shape[0]):
        n = int((parents[b] != NO_NODE).sum())
        start = int(inputs["row_start"][b])  # type: ignore[index]
        rows = probs[start : start + 1 + n]
        if bool(inputs["greedy"][b]):  # type: ignore[index]
            want = verify_tree_greedy(
                parents[b, :n].tolist(), tokens[b, :n].tolist(), rows.argmax(-1).tolist()
            )
        else:
            u = inputs["uniforms"][b].tolist()  # type: ignore[index]
            nodes_q = q[b, :n] if q is not None else None
            want = verify_tree(parents[b, :n].tolist(), tokens[b, :n].tolist(), rows, nodes_q, u[:n], u[-1])
        got = [i for i in path[b].tolist() if i >= 0]
        assert (got, int(final[b])) == (want.path, want.final_token), (seed, b)


@pytest.mark.parametrize("seed", range(40))
def test_the_batched_op_is_the_reference(seed: int) -> None:
    _check_against_the_reference(_batch(seed), seed)


@pytest.mark.parametrize(("vocab_block", "f64"), [(16, True), (64, True), (16, False)])
def test_the_triton_op_is_the_torch_op(vocab_block: int, f64: bool) -> None:
    """``f64=False`` (Ascend's tuning: no float64 on its vector cores): float32 scalars, the same
    decisions here (a tie within float32 rounding would be needed to differ)."""
    pytest.importorskip("triton")
    from spec_backend.sampling.triton.ops import TritonSamplerOps

    ops = TritonSamplerOps(SamplerTuning(vocab_block=vocab_block, device_uniforms=f64))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for seed in range(12):
        inputs = _batch(100 + seed, batch=4, m=5)
        want = TorchTreeOps().tree_verify(**inputs)  # type: ignore[arg-type]
        on_device = {k: v.to(device) if v is not None else None for k, v in inputs.items()}
        got = ops.tree_verify(**on_device)  # type: ignore[arg-type]
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), seed
    no_greedy = {**_batch(7, batch=3, m=4), "target_argmax": None}
    no_greedy["greedy"] = torch.zeros(3, dtype=torch.bool)
    want = TorchTreeOps().tree_verify(**no_greedy)  # type: ignore[arg-type]
    got = ops.tree_verify(**{k: v.to(device) if v is not None else None for k, v in no_greedy.items()})  # type: ignore[arg-type]
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


def _sampled_batch(seed: int, batch: int = 6, m: int = 6) -> dict[str, torch.Tensor | None]:
    """``_batch``'s trees with sampled siblings: each node's ``q`` (some tokens at 0) and its token drawn
    from it, now and then one ``q`` gives no mass (a node the rule must reject); every third request a
    chain of ``m`` nodes that the target's own distributions draft (so whole chains are accepted and
    the final token comes after the last node)."""
    inputs = _batch(seed, batch, m, full=3)
    gen = torch.Generator().manual_seed(seed)
    probs, parents, tokens = inputs["target_probs"], inputs["parents"], inputs["tokens"]
    starts = inputs["row_start"]
    assert probs is not None and parents is not None and tokens is not None and starts is not None
    logits = torch.randn(batch, m, V, generator=gen, dtype=torch.float64) * 2.0
    logits[torch.rand(logits.shape, generator=gen) < 0.3] = float("-inf")
    logits[..., 0] = 0.0
    q = torch.softmax(logits, -1)  # [B, M, V]
    for b in range(batch):
        n = int((parents[b] != NO_NODE).sum())
        if b % 3 == 2:  # a chain the target drafts for itself
            parents[b, :n] = torch.arange(-1, n - 1)
            q[b, :n] = probs[int(starts[b]) : int(starts[b]) + n].double()
        for i in range(n):
            tokens[b, i] = int(torch.multinomial(q[b, i], 1, generator=gen))
            if torch.rand((), generator=gen) < 0.1:
                q[b, i, tokens[b, i]] = 0.0  # a draft that says its token was impossible
    inputs["greedy"] = torch.rand(batch, generator=gen) < 0.2
    return {**inputs, "draft_probs": q.float()}


@pytest.mark.parametrize("seed", range(30))
def test_the_batched_op_with_draft_probs_is_the_reference(seed: int) -> None:
    _check_against_the_reference(_sampled_batch(seed), seed)


def test_draft_probs_change_the_decisions() -> None:
    """Negative control: the same sampled trees judged as point masses take other paths (the op reads
    ``draft_probs``)."""
    differ = 0
    for seed in range(20):
        inputs = _sampled_batch(seed)
        with_q = TorchTreeOps().tree_verify(**inputs)  # type: ignore[arg-type]
        point = TorchTreeOps().tree_verify(**{**inputs, "draft_probs": None})  # type: ignore[arg-type]
        differ += int(not (torch.equal(with_q[0], point[0]) and torch.equal(with_q[1], point[1])))
    assert differ >= 10


@pytest.mark.parametrize(("vocab_block", "f64"), [(16, True), (64, True), (16, False)])
def test_the_triton_op_with_draft_probs_is_the_torch_op(vocab_block: int, f64: bool) -> None:
    """Sampled siblings (``triton.tree_sampled``): the same paths and final tokens as the torch op, whole
    chains accepted included."""
    pytest.importorskip("triton")
    from spec_backend.sampling.triton.ops import TritonSamplerOps

    ops = TritonSamplerOps(SamplerTuning(vocab_block=vocab_block, device_uniforms=f64))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    full_chains = 0
    for seed in range(10):
        inputs = _sampled_batch(200 + seed, batch=4, m=4)
        want = TorchTreeOps().tree_verify(**inputs)  # type: ignore[arg-type]
        full_chains += int(((want[0] >= 0).sum(dim=1) == 4).sum())  # every level descended
        on_device = {k: v.to(device) if v is not None else None for k, v in inputs.items()}
        got = ops.tree_verify(**on_device)  # type: ignore[arg-type]
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), seed
    assert full_chains > 0  # the final token after a whole accepted chain was compared too
