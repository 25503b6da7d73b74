"""Multi-path drafting (#42, ``tree_paths``): ``P`` draft paths of ``depth`` tokens, each drawn from the
drafter's distribution independently of the others, merged into a trie and verified by greedy multi-path
block verification (``verify_rules.TREE_REGISTRY``'s ``gbv``; ``sampling.gbv_ops``).

Glossary:

* *slot* — one of the ``P`` paths while it grows: level ``l`` of slot ``j`` is grown node ``l·P + j``,
  whose parent is level ``l − 1`` of the same slot; each level's forward feeds every slot's nodes so far
  (``dynamic_tree.feed_level``: each node with its parent's output, under tree attention), so each slot's
  next token comes from the distribution the chain through its path gives.
* *draw* — a sampled request's token for slot ``j`` at level ``l`` is ``argmax q / E`` (an exponential
  race: a draw from ``q``), ``q`` the drafter's distribution under the request's temperature and
  ``E = −log u`` with ``u`` counter-based: the request's seed, the step's first draft position, ``l`` and
  ``j`` (``rng.STREAM_DRAFT``). Greedy requests take the argmax (their slots coincide).
* *trie* — the slots' paths merged (a shared prefix is one node), numbered level by level; each node
  carries the ``q`` it was drawn from (``DraftOutput.draft_probs``), which GBV's skew reads.

The slots are independent given the context, which is what GBV's law of the selected path assumes; a
request whose budget is ``b`` verifies the nodes of depth ``<= b`` — the trie of the same paths cut at
``b``, still i.i.d.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spec_backend.proposers.contract import DraftOutput, DraftRequest
from spec_backend.proposers.dynamic_tree import Grower, feed_level
from spec_backend.proposers.sibling_draws import draft_noise
from spec_backend.sampling import rng
from spec_backend.sampling.probs import target_probs

#: the first noise counter of multi-path draws (sibling draws use parent + 1 from 0)
_COUNTER = 1 << 20


def _draw(
    log_probs: torch.Tensor,  # [B, P, V]
    temps: torch.Tensor,  # [B]
    key: torch.Tensor,  # [B]
    level: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, P], q [B, P, V] float32
    """Each slot's token at ``level`` and the distribution it was drawn from (module docstring)."""
    batch, paths, vocab = log_probs.shape
    rows = log_probs.reshape(batch * paths, vocab)  # [B·P, V]
    t = temps.repeat_interleave(paths)  # [B·P]
    off_k, off_p = torch.zeros_like(t, dtype=torch.int64), torch.ones_like(t)
    q = target_probs(rows, t, off_k, off_p, apply_top_k=False, apply_top_p=False)  # [B·P, V]
    slots = torch.arange(paths, device=key.device)
    keys = rng.absorb(key[:, None], _COUNTER + level * paths + slots).reshape(-1, 1)  # [B·P, 1]
    buf = torch.empty(q.shape, dtype=torch.int64, device=q.device)  # [B·P, V]
    uniform = rng.vocab_uniform_f32_into(keys, 0, buf, torch.empty_like(buf))  # [B·P, V] in (0, 1)
    drawn = torch.argmax(q / uniform.log().neg(), dim=-1)  # [B·P]
    greedy = t <= 0
    top = torch.argmax(rows, dim=-1)  # [B·P]
    tokens = torch.where(greedy, top, drawn)
    q = torch.where(greedy[:, None], torch.nn.functional.one_hot(top, vocab).to(q.dtype), q)
    return tokens.view(batch, paths), q.view(batch, paths, vocab)


def grow_paths(grower: Grower, depth: int, paths: int, requests: Sequence[DraftRequest]) -> DraftOutput:
    """``paths`` i.i.d. draft paths of ``depth`` tokens per request, merged into a trie (module
    docstring)."""
    if depth < 1 or paths < 1:
        raise ValueError(f"depth and paths must be >= 1, got {depth} and {paths}")
    root = grower.root  # [B, H]
    batch = root.shape[0]
    temps, key = draft_noise(requests, root.device)  # [B], [B]
    log_probs = grower.log_probs(root)[:, None].expand(-1, paths, -1)  # [B, P, V]
    tokens = torch.zeros((batch, 0), dtype=torch.int64, device=root.device)  # [B, G] grown, level-major
    outs = root.new_zeros((batch, 0, root.shape[1]))  # [B, G, H]
    parents: list[list[int]] = [[] for _ in range(batch)]  # host [B][G]
    drawn_from: list[torch.Tensor] = []  # per level [B, P, V]
    for level in range(depth):
        drawn, q = _draw(log_probs, temps, key, level)  # [B, P], [B, P, V]
        drawn_from.append(q)
        base = tokens.shape[1]
        tokens = torch.cat([tokens, drawn], dim=1)
        for row in parents:
            row += [base - paths + j if level else -1 for j in range(paths)]
        if level + 1 < depth:
            outs = torch.cat([outs, outs.new_zeros((batch, paths, outs.shape[2]))], dim=1)
            frontier = [list(range(base, base + paths))] * batch
            outs = feed_level(root, grower.forward, tokens, outs, parents, frontier)
            log_probs = grower.log_probs(outs[:, base : base + paths])  # [B, P, V]
    grower.done()
    sampled = any(r.temperature > 0 for r in requests)
    return merge_paths(tokens.view(batch, depth, paths), torch.stack(drawn_from, dim=1) if sampled else None)


def merge_paths(
    tokens: torch.Tensor,  # [B, L, P]: level l of slot j
    probs: torch.Tensor | None,  # [B, L, P, V]: what each was drawn from (None: greedy only)
) -> DraftOutput:
    """The trie of each request's ``P`` paths, level by level (module docstring)."""
    batch, depth, paths = tokens.shape
    host = tokens.tolist()
    shapes: list[tuple[int, ...]] = []
    ids: list[list[int]] = []
    source: list[list[int]] = []  # per request, each node's grown index l·P + j (its first slot)
    for b in range(batch):
        index: dict[tuple[int, ...], int] = {}
        parents: list[int] = []
        node_ids: list[int] = []
        first: list[int] = []
        for level in range(depth):
            for j in range(paths):
                prefix = tuple(host[b][d][j] for d in range(level + 1))
                if prefix not in index:
                    index[prefix] = len(node_ids)
                    parents.append(index[prefix[:-1]] if level else -1)
                    node_ids.append(prefix[-1])
                    first.append(level * paths + j)
        shapes.append(tuple(parents))
        ids.append(node_ids)
        source.append(first)
    width = max(len(n) for n in ids)
    token_ids = torch.tensor([n + [0] * (width - len(n)) for n in ids], dtype=torch.int64)  # [B, M]
    draft_probs = None
    if probs is not None:
        flat = probs.reshape(batch, depth * paths, probs.shape[-1])  # [B, L·P, V]
        gather = torch.tensor([s + [0] * (width - len(s)) for s in source], device=probs.device)  # [B, M]
        draft_probs = flat.gather(1, gather[..., None].expand(-1, -1, flat.shape[-1]))  # [B, M, V]
    return DraftOutput(
        token_ids.to(tokens.device),
        tuple(len(n) for n in ids),
        tree_parents=tuple(shapes),
        draft_probs=draft_probs,
    )


__all__ = ["grow_paths", "merge_paths"]
