"""Per-request state in the engine: tokens so far, stop checks, speculation counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spec_backend.engine.params import (
    CompletionOutput,
    FinishReason,
    Logprob,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
    SamplingParams,
    SpecDecodeRequestStats,
)
from spec_backend.engine.structured import RequestGrammar


@dataclass
class Request:
    """A request in flight. Its KV cache holds every token but the last output token (the next input)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # the request's RNG seed (its own, or drawn from the engine's seed)
    eos_token_ids: frozenset[int]
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    text: str = ""
    stats: SpecDecodeRequestStats = field(default_factory=SpecDecodeRequestStats)
    num_steps: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    #: Which of its prompt's ``n`` samples this is (``CompletionOutput.index``), and the id of the
    #: prompt's output (its own id when ``n`` is 1).
    index: int = 0
    parent_id: str = ""
    logprobs: SampleLogprobs | None = None  # one entry per output token when ``params.logprobs`` is set
    prompt_logprobs: PromptLogprobs | None = None
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))
    grammar: RequestGrammar | None = None  # structured outputs' matcher (``structured.py``)
    num_cached_tokens: int = 0  # prompt positions a prefix-cache hit served (``engine/prefix.py``)
    cache_salt: str | None = None  # only requests with the same salt share prefix-cache blocks
    #: output tokens its drafter has been given (``Drafter.defers_follow``: held steps leave it behind)
    drafter_seen: int = 0

    def unseen_tokens(self) -> list[int]:
        """The output tokens its drafter has not been given yet; from now on it has them."""
        tokens = self.output_token_ids[self.drafter_seen :]
        self.drafter_seen = len(self.output_token_ids)
        return tokens

    def samples(self, parent_id: str, fresh_seed: Callable[[], int]) -> list[Request]:
        """The ``params.n`` requests sampling this prompt (this one when ``n`` is 1). With a seed, sample
        ``i`` uses ``seed + i`` (vLLM's rule, wrapped into [0, 2**63)); otherwise each draws a fresh one."""
        seed = self.params.seed
        out = []
        for i in range(self.params.n):
            sample = (
                self
                if i == 0
                else Request(
                    "",
                    self.prompt,
                    list(self.prompt_token_ids),
                    self.params,
                    0,
                    self.eos_token_ids,
                    cache_salt=self.cache_salt,
                )
            )
            sample.request_id = parent_id if self.params.n == 1 else f"{parent_id}-{i}"
            sample.parent_id, sample.index = parent_id, i
            sample.seed = (seed + i) % 2**63 if seed is not None else fresh_seed()
            out.append(sample)
        return out

    @property
    def min_tokens_stop_ids(self) -> list[int]:
        """What ``min_tokens`` forbids: EOS (unless ``ignore_eos``) and the ``stop_token_ids``."""
        ids = set(self.params.stop_token_ids or ())
        if not self.params.ignore_eos:
            ids |= self.eos_token_ids
        return sorted(ids)

    @property
    def temperature(self) -> float:
        """The request's sampling temperature (0: greedy)."""
        return self.params.temperature

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def remaining(self) -> int:
        """Tokens this request may still generate."""
        return self.params.max_tokens - len(self.output_token_ids)

    def fail(self, message: str) -> None:
        """End this request with ``finish_reason="error"``; other requests carry on."""
        self.finish_reason = "error"
        self.error = message

    def record_verification(self, num_drafted: int, num_accepted: int) -> None:
        """Count one verification step that drafted ``num_drafted`` tokens and accepted ``num_accepted``."""
        self.num_steps += 1
        self.stats.observe(num_drafted, num_accepted)

    def append_tokens(self, tokens: list[int], tokenizer: Any | None, max_len: int) -> list[int]:
        """Append sampled tokens one by one, stopping at the first stop condition.

        Returns the tokens actually kept (a prefix of ``tokens``). Stop token ids and EOS (unless
        ``ignore_eos``) are kept in ``token_ids``; ``max_tokens``, and ``max_len`` (the engine's
        ``max_model_len``: prompt + output), truncate with ``finish_reason="length"``; stop strings end
        generation with the text cut before the stop string.
        """
        params = self.params
        stop_ids = set(params.stop_token_ids or ())
        kept: list[int] = []
        for token in tokens:
            self.output_token_ids.append(token)
            kept.append(token)
            if token in stop_ids:
                self.finish_reason, self.stop_reason = "stop", token
            elif (not params.ignore_eos and token in self.eos_token_ids) or (
                params.stop and tokenizer is not None and self._hit_stop_string(tokenizer)
            ):
                self.finish_reason = "stop"
            elif self.remaining <= 0 or self.num_tokens >= max_len:
                self.finish_reason = "length"
            if self.finished:
                break
        if self.grammar is not None:
            self.grammar.accept(kept)
        self.metrics.record(time.perf_counter(), len(kept))
        return kept

    def _hit_stop_string(self, tokenizer: Any) -> bool:
        assert self.params.stop is not None
        text = tokenizer.decode(self.output_token_ids, skip_special_tokens=self.params.skip_special_tokens)
        longest = max(len(s) for s in self.params.stop)
        # only the tail can hold a new match: the last token adds at most a few characters
        tail_start = max(0, len(text) - longest - 32)
        best: tuple[int, str] | None = None
        for s in self.params.stop:
            idx = text.find(s, tail_start)
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return False
        end = best[0] + (len(best[1]) if self.params.include_stop_str_in_output else 0)
        self.text, self.stop_reason = text[:end], best[1]
        return True

    def to_output(self, tokenizer: Any | None) -> RequestOutput:
        """The user-facing result (text decoded unless a stop string already fixed it)."""
        if tokenizer is not None and not (self.finish_reason == "stop" and isinstance(self.stop_reason, str)):
            try:
                self.text = tokenizer.decode(
                    self.output_token_ids, skip_special_tokens=self.params.skip_special_tokens
                )
            except Exception as exc:  # a broken detokenizer must not lose the tokens
                self.fail(f"detokenization failed: {type(exc).__name__}: {exc}")
        logprobs = _decoded(self.logprobs, tokenizer)
        completion = CompletionOutput(
            index=self.index,
            text=self.text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            error=self.error,
            stop_reason=self.stop_reason,
            cumulative_logprob=None if logprobs is None else _cumulative(logprobs, self.output_token_ids),
            logprobs=logprobs,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            outputs=[completion],
            finished=self.finished,
            prompt_logprobs=_decoded(self.prompt_logprobs, tokenizer),
            spec_stats=self.stats,
            num_steps=self.num_steps,
            kv_transfer_params=self.kv_transfer_params,
            metrics=self.metrics,
            num_cached_tokens=self.num_cached_tokens,
        )


def _decoded(entries: list[Any] | None, tokenizer: Any | None) -> Any:
    """``entries`` (logprobs dicts, ``None`` allowed) with each token's text filled in (vLLM's
    ``decoded_token``) when there is a tokenizer."""
    if entries is None or tokenizer is None:
        return entries
    ids = sorted({t for entry in entries if entry is not None for t in entry})
    texts = dict(zip(ids, tokenizer.batch_decode([[t] for t in ids]), strict=True))
    return [
        None if entry is None else {t: Logprob(lp.logprob, lp.rank, texts[t]) for t, lp in entry.items()}
        for entry in entries
    ]


def _cumulative(logprobs: SampleLogprobs, tokens: list[int]) -> float:
    return float(sum(entry[t].logprob for entry, t in zip(logprobs, tokens, strict=False)))


def merge_samples(requests: Sequence[Request], tokenizer: Any | None) -> list[RequestOutput]:
    """One ``RequestOutput`` per prompt: the outputs of its ``n`` samples (consecutive in ``requests``)
    as ``outputs[0..n-1]``; finished when all are; speculation counters summed."""
    merged: list[RequestOutput] = []
    for request in requests:
        output = request.to_output(tokenizer)
        if request.index == 0:
            output.request_id = request.parent_id or request.request_id
            output.spec_stats = SpecDecodeRequestStats()  # a sum of its own, not the request's counters
            output.spec_stats.merge(request.stats)
            merged.append(output)
            continue
        first = merged[-1]
        first.outputs.append(output.outputs[0])
        first.finished = first.finished and output.finished
        first.num_steps = max(first.num_steps, output.num_steps)
        first.spec_stats.merge(output.spec_stats)
    return merged
