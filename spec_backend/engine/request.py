"""Per-request state in the engine: tokens so far, stop checks, speculation counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spec_backend.engine.params import (
    CompletionOutput,
    FinishReason,
    RequestOutput,
    SamplingParams,
    SpecDecodeRequestStats,
)


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

    def append_tokens(self, tokens: list[int], tokenizer: Any | None) -> list[int]:
        """Append sampled tokens one by one, stopping at the first stop condition.

        Returns the tokens actually kept (a prefix of ``tokens``). Stop token ids and EOS (unless
        ``ignore_eos``) are kept in ``token_ids``; ``max_tokens`` truncates; stop strings end generation
        with the text cut before the stop string.
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
            elif self.remaining <= 0:
                self.finish_reason = "length"
            if self.finished:
                break
        return kept

    def _hit_stop_string(self, tokenizer: Any) -> bool:
        assert self.params.stop is not None
        text = tokenizer.decode(self.output_token_ids, skip_special_tokens=True)
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
        self.text, self.stop_reason = text[: best[0]], best[1]
        return True

    def to_output(self, tokenizer: Any | None) -> RequestOutput:
        """The user-facing result (text decoded unless a stop string already fixed it)."""
        if tokenizer is not None and not (self.finish_reason == "stop" and isinstance(self.stop_reason, str)):
            try:
                self.text = tokenizer.decode(self.output_token_ids, skip_special_tokens=True)
            except Exception as exc:  # a broken detokenizer must not lose the tokens
                self.fail(f"detokenization failed: {type(exc).__name__}: {exc}")
        completion = CompletionOutput(
            index=0,
            text=self.text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            error=self.error,
            stop_reason=self.stop_reason,
        )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_token_ids),
            outputs=[completion],
            finished=self.finished,
            spec_stats=self.stats,
            num_steps=self.num_steps,
            kv_transfer_params=self.kv_transfer_params,
        )
