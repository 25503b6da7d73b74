"""vLLM's per-request logits processing on the target's rows before verification, and the
log-probabilities users ask for after it.

Glossary:

* **row**: one target logits row. In a decode step request ``b`` owns rows ``loc[b] .. loc[b] + Q_b - 1``;
  row ``j`` verifies draft ``j``, and the token emitted from it becomes output token
  ``len(output) + j``. In a prefill (``last_only``) request ``b`` owns row ``b``.
* **history of a row**: the request's output tokens followed by the drafts fed before that row — the
  output the request has if that row's token is emitted. Penalties and ``min_tokens`` read it, so every
  row is processed exactly as plain decoding would process it at that position: speculative output
  stays lossless (the rejection sampler sees the same target distribution).
* **raw log-probabilities**: ``log_softmax`` of the model's logits before any processing (vLLM's
  default ``logprobs_mode="raw_logprobs"``): independent of penalties, temperature and speculation.

Order, as vLLM's sampler: the grammar mask of structured outputs → ``allowed_token_ids`` → ``min_tokens`` →
``logit_bias`` → repetition, frequency, presence penalties → ``min_p`` (the temperature and top-k/top-p
filters follow in the sampler).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spec_backend.engine.params import Logprob, SamplingParams
from spec_backend.engine.request import Request


@dataclass(frozen=True)
class RowHistory:
    """Who owns each row and what came before it (host lists, one entry per row)."""

    owner: list[int]  # [R] request index of each row
    prior: list[list[int]]  # [R] drafts fed before the row (its history after the output tokens)

    @staticmethod
    def of(query_lens: Sequence[int], drafts: Sequence[Sequence[int]], last_only: bool) -> RowHistory:
        """``drafts[b]``: request ``b``'s real drafts (placeholders excluded); ``query_lens``: its rows."""
        if last_only:
            return RowHistory(list(range(len(query_lens))), [[] for _ in query_lens])
        owner, prior = [], []
        for b, q in enumerate(query_lens):
            for j in range(q):
                owner.append(b)
                prior.append(list(drafts[b][:j]))
        return RowHistory(owner, prior)


def _dense(rows: list[int], cols: list[int], shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    """``[R, V]`` float counts of ``(row, col)`` pairs."""
    out = torch.zeros(shape, dtype=torch.float32, device=device)
    if rows:
        idx = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
        out.index_put_(idx, torch.ones(len(rows), device=device), accumulate=True)
    return out


def _output_counts(
    outputs: Sequence[Sequence[int]], history: RowHistory, shape: tuple[int, int], device: torch.device
) -> torch.Tensor:
    """``[R, V]`` how often each token occurs in each row's history (output tokens, then prior drafts)."""
    per_request = _dense(
        [b for b, out in enumerate(outputs) for _ in out],
        [t for out in outputs for t in out],
        (len(outputs), shape[1]),
        device,
    )  # [B, V]
    owner = torch.tensor(history.owner, device=device)  # [R]
    prior = _dense(
        [r for r, p in enumerate(history.prior) for _ in p],
        [t for p in history.prior for t in p],
        shape,
        device,
    )
    return per_request[owner] + prior  # [R, V]


def _per_row(values: Sequence[float], owner: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[R, 1]`` a per-request value spread over its rows."""
    return torch.tensor(list(values), dtype=dtype, device=owner.device)[owner][:, None]


def _apply_penalties(
    logits: torch.Tensor,  # [R, V] float32, changed in place
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    history: RowHistory,
) -> None:
    if not any(p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty for p in params):
        return
    device, (num_rows, vocab) = logits.device, logits.shape
    owner = torch.tensor(history.owner, device=device)  # [R]
    counts = _output_counts(outputs, history, (num_rows, vocab), device).to(logits.dtype)  # [R, V]
    in_prompt = (
        _dense(
            [b for b, pr in enumerate(prompts) for _ in pr],
            [t for pr in prompts for t in pr],
            (len(prompts), vocab),
            device,
        )[owner]
        > 0
    )  # [R, V]
    rep = _per_row([p.repetition_penalty for p in params], owner, logits.dtype)  # [R, 1]
    seen = in_prompt | (counts > 0)  # [R, V]
    penalised = torch.where(logits > 0, logits / rep, logits * rep)  # [R, V]
    logits.copy_(torch.where(seen, penalised, logits))
    freq = _per_row([p.frequency_penalty for p in params], owner, logits.dtype)  # [R, 1]
    pres = _per_row([p.presence_penalty for p in params], owner, logits.dtype)  # [R, 1]
    logits.sub_(freq * counts + pres * (counts > 0).to(logits.dtype))


def _apply_masks_and_bias(
    logits: torch.Tensor,  # [R, V] float32, changed in place
    params: Sequence[SamplingParams],
    outputs: Sequence[Sequence[int]],
    history: RowHistory,
    stop_ids: Sequence[Sequence[int]],
) -> None:
    vocab, device = logits.shape[1], logits.device
    for r, b in enumerate(history.owner):
        p = params[b]
        if p.allowed_token_ids is not None:
            keep = torch.zeros(vocab, dtype=torch.bool, device=device)
            keep[torch.tensor(p.allowed_token_ids, device=device)] = True
            logits[r].masked_fill_(~keep, -math.inf)
        if len(outputs[b]) + len(history.prior[r]) < p.min_tokens and stop_ids[b]:
            logits[r, torch.tensor(list(stop_ids[b]), device=device)] = -math.inf
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=device)
            logits[r, ids] += torch.tensor(list(p.logit_bias.values()), device=device)


def _apply_min_p(logits: torch.Tensor, params: Sequence[SamplingParams], owner: list[int]) -> None:
    """Drop tokens whose probability after temperature is below ``min_p`` times the top one's:
    ``l < max(l) + T * log(min_p)`` (greedy rows are unaffected: the argmax always survives)."""
    rows = [r for r, b in enumerate(owner) if params[b].min_p > 0.0 and not params[b].greedy]
    if not rows:
        return
    idx = torch.tensor(rows, device=logits.device)
    floor = [params[owner[r]].temperature * math.log(params[owner[r]].min_p) for r in rows]
    sub = logits[idx]  # [M, V]
    cut = sub.max(dim=-1, keepdim=True).values + torch.tensor(floor, device=logits.device)[:, None]  # [M, 1]
    logits[idx] = sub.masked_fill(sub < cut, -math.inf)


def process_logits(
    logits: torch.Tensor,  # [R, V] raw target logits
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    stop_ids: Sequence[Sequence[int]],
    history: RowHistory,
    allowed: torch.Tensor | None = None,  # [R, V] bool: structured outputs' row masks
) -> torch.Tensor:  # [R, V]
    """The logits the sampler verifies against (a new tensor; ``logits`` itself is untouched).

    ``stop_ids[b]``: the ids ``min_tokens`` forbids (EOS unless ``ignore_eos``, and ``stop_token_ids``).
    ``allowed``: the tokens each row's grammar allows (``structured.py``), applied first.
    """
    if not any(p.processes_logits for p in params):
        return logits
    out = logits.clone() if logits.dtype == torch.float64 else logits.float().clone()  # [R, V]
    if allowed is not None:
        out.masked_fill_(~allowed.to(out.device), -math.inf)
    _apply_masks_and_bias(out, params, outputs, history, stop_ids)
    _apply_penalties(out, params, prompts, outputs, history)
    _apply_min_p(out, params, history.owner)
    return out


def token_logprobs(
    logits: torch.Tensor,  # [R, V] raw target logits
    rows: Sequence[int],  # [M] the rows to read
    tokens: Sequence[int],  # [M] the token each row chose
    top: Sequence[int],  # [M] how many most likely tokens to add per row
) -> list[dict[int, Logprob]]:
    """vLLM's logprobs entries: the chosen token (with its rank) followed by the ``top`` most likely."""
    if not rows:
        return []
    device = logits.device
    picked = logits[torch.tensor(list(rows), device=device)]  # [M, V]
    lp = torch.log_softmax(picked if picked.dtype == torch.float64 else picked.float(), dim=-1)  # [M, V]
    chosen = lp.gather(1, torch.tensor(list(tokens), device=device)[:, None])  # [M, 1]
    ranks = (lp > chosen).sum(dim=1) + 1  # [M]
    k = max(top)
    top_lp, top_ids = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())  # [M, k]
    chosen_h, ranks_h = chosen[:, 0].tolist(), ranks.tolist()
    top_lp_h, top_ids_h = top_lp.tolist(), top_ids.tolist()
    entries = []
    for m, token in enumerate(tokens):
        entry = {token: Logprob(chosen_h[m], ranks_h[m])}
        for i in range(top[m]):
            entry.setdefault(top_ids_h[m][i], Logprob(top_lp_h[m][i], i + 1))
        entries.append(entry)
    return entries


def record_logprobs(
    requests: Sequence[Request],
    kept: Sequence[Sequence[int]],  # per request: the tokens it kept this step
    logits: torch.Tensor,  # [R, V] raw target logits of the step
    query_lens: Sequence[int],
    last_only: bool,
) -> None:
    """Append the logprobs entries of the kept tokens of requests that asked for ``logprobs``."""
    rows, tokens, top, owners = [], [], [], []
    at = 0
    for b, request in enumerate(requests):
        base, at = (b if last_only else at), at + query_lens[b]
        k = request.params.logprobs
        if k is None:
            continue
        for j, token in enumerate(kept[b]):
            rows.append(base + j)
            tokens.append(token)
            top.append(k)
            owners.append(b)
    for b, entry in zip(owners, token_logprobs(logits, rows, tokens, top), strict=True):
        request = requests[b]
        if request.logprobs is None:
            request.logprobs = []
        request.logprobs.append(entry)  # in place: copying the list every step would be quadratic


def record_prompt_logprobs(
    requests: Sequence[Request],
    logits: torch.Tensor,  # [N, V] raw target logits of every prompt row of a prefill
    query_lens: Sequence[int],
) -> None:
    """``prompt_logprobs`` of the requests that asked: ``None`` for the first token, then token ``t``
    read from row ``t - 1``."""
    at = 0
    for b, request in enumerate(requests):
        k, length = request.params.prompt_logprobs, query_lens[b]
        if k is not None:
            rows = range(at, at + length - 1)
            entries = token_logprobs(logits, rows, request.prompt_token_ids[1:], [k] * (length - 1))
            request.prompt_logprobs = [None, *entries]
        at += length


__all__ = ["RowHistory", "process_logits", "record_logprobs", "record_prompt_logprobs", "token_logprobs"]
