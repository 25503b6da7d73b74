"""User-facing request types: ``SamplingParams`` in, ``RequestOutput`` out (vLLM's offline shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from spec_backend.engine.params_check import (
    check_int,
    check_logit_bias,
    check_range,
    check_token_list,
    refuse_unknown,
)
from spec_backend.engine.structured import StructuredOutputsParams
from spec_backend.metrics import SpecDecodingStats
from spec_backend.sampling.sampling_metadata import check_seed

FinishReason = Literal["stop", "length", "error"]


@dataclass(kw_only=True)
class _SamplingFields:
    """The fields of ``SamplingParams`` (documented there)."""

    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        check_int("n", self.n, 1)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not 0.0 <= float(self.temperature) < float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        self.temperature = float(self.temperature)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {self.top_k!r}")
        self.top_p = check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        self.min_p = check_range("min_p", self.min_p, 0.0, 1.0)
        check_seed(self.seed)  # None or [0, 2**63 - 1]: every accepted seed is reproducible
        check_int("max_tokens", self.max_tokens, 1)
        check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        self._check_stops()
        self.presence_penalty = check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        self.frequency_penalty = check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        self.repetition_penalty = check_range(
            "repetition_penalty", self.repetition_penalty, 0.0, float("inf"), low_open=True
        )
        self.logit_bias = check_logit_bias(self.logit_bias)
        self.allowed_token_ids = check_token_list("allowed_token_ids", self.allowed_token_ids)
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must name at least one token id, got []")
        check_int("logprobs", self.logprobs, 0, optional=True)
        check_int("prompt_logprobs", self.prompt_logprobs, 0, optional=True)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self.structured_outputs = StructuredOutputsParams.of(self.structured_outputs)
        if self.structured_outputs is not None and self.ignore_eos:
            raise ValueError(
                "ignore_eos=True cannot be combined with structured_outputs: the grammar ends the output "
                "with EOS; got both"
            )

    def _check_stops(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not isinstance(self.stop, list | tuple) or not all(
                isinstance(s, str) and s for s in self.stop
            ):
                raise ValueError(
                    f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r}"
                )
            self.stop = list(self.stop)
        self.stop_token_ids = check_token_list("stop_token_ids", self.stop_token_ids)


class SamplingParams(_SamplingFields):
    """How to sample one request, with vLLM's names and meanings; validated on construction (``ValueError``
    naming the field; an argument that is not a field, vLLM's unimplemented ones included, is named too).

    * ``n`` samples per prompt (``outputs[0..n-1]``); with a ``seed``, sample ``i`` uses ``seed + i``.
    * ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1.0 disable those filters; ``min_p`` drops
      tokens below ``min_p`` times the most likely token's probability (after temperature).
    * ``seed`` (None, or an int in [0, 2**63 - 1]; vLLM's ``-1`` for "unseeded" is refused: pass None)
      makes the request's samples reproducible whatever else is in the batch.
    * ``max_tokens`` caps generated tokens; ``min_tokens`` forbids EOS and ``stop_token_ids`` before that
      many; ``stop`` strings end generation (excluded from the text unless ``include_stop_str_in_output``);
      ``stop_token_ids`` end it (included in ``token_ids``); ``ignore_eos`` keeps going past EOS.
    * Penalties (vLLM's): ``repetition_penalty`` (> 0; 1 is off) divides the positive logits and multiplies
      the negative ones of tokens seen in the prompt or output; ``frequency_penalty`` and
      ``presence_penalty`` (in [-2, 2]) subtract ``f * count`` and ``p * (count > 0)`` over output tokens.
    * ``logit_bias`` ``{token_id: bias in [-100, 100]}`` is added to the logits; ``allowed_token_ids``
      restricts sampling to those tokens.
    * ``logprobs`` k: each output token's log-probability, its rank and the k most likely tokens;
      ``prompt_logprobs`` k: the same for prompt tokens (the first is ``None``). Log-probabilities are the
      target model's raw ones (before penalties and temperature: vLLM's ``raw_logprobs``), so they are the
      same with and without speculation.
    * ``skip_special_tokens`` leaves special tokens out of the text.
    * ``structured_outputs`` (a ``StructuredOutputsParams`` or a dict of its fields) constrains the output
      to a JSON schema, a regex, a choice or a grammar (``engine/structured.py``); it ends with EOS when
      the grammar is complete.

    Everything above is computed from the target's logits, so speculative decoding stays lossless.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            raise ValueError(f"SamplingParams takes keyword arguments only, got positional {args!r}")
        refuse_unknown(kwargs, {f.name for f in fields(_SamplingFields)})
        super().__init__(**kwargs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def processes_logits(self) -> bool:
        """Whether the target's logits are changed before sampling (penalties, biases, masks)."""
        return bool(
            self.min_tokens
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.allowed_token_ids is not None
            or (self.min_p > 0.0 and not self.greedy)
            or self.structured_outputs is not None
        )


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability (raw, from the target), its 1-based rank and its text (vLLM's type)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: Per position: token id -> ``Logprob`` (the chosen token, then the top ``k``), as vLLM returns them.
SampleLogprobs = list[dict[int, Logprob]]
#: ``prompt_logprobs``: ``None`` for the first prompt token, then one dict per token.
PromptLogprobs = list[dict[int, Logprob] | None]


#: One request's speculation counters: the same statistics the engine aggregates for its metrics.
SpecDecodeRequestStats = SpecDecodingStats


@dataclass
class CompletionOutput:
    """One generated sequence: text, token ids, and why it ended (``error`` holds the failure message)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    error: str | None = None
    stop_reason: str | int | None = None
    #: Sum of the chosen tokens' raw log-probabilities (``None`` unless ``logprobs`` was asked for).
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None


@dataclass
class RequestMetrics:
    """When a request's tokens came, in ``time.perf_counter()`` seconds: ``arrival_time`` when it was
    added, ``first_token_time`` when its first token was sampled (its prefill done), ``last_token_time``
    when its last one was. ``decode_tokens_per_s`` is the decode rate after the prefill, the figure
    llama.cpp's ``eval time`` line reports."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0

    def record(self, now: float, num_tokens: int) -> None:
        """``num_tokens`` more output tokens were kept at ``now``."""
        if num_tokens:
            self.first_token_time = now if self.first_token_time is None else self.first_token_time
            self.last_token_time, self.num_output_tokens = now, self.num_output_tokens + num_tokens

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Output tokens after the first over the time after the first; ``None`` before two steps."""
        if self.first_token_time is None or self.last_token_time is None:
            return None
        seconds = self.last_token_time - self.first_token_time
        return (self.num_output_tokens - 1) / seconds if seconds > 0 else None


@dataclass
class RequestOutput:
    """The result for one prompt, in the order the prompts were given."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    prompt_logprobs: PromptLogprobs | None = None
    #: Prompt positions served from the prefix cache (``enable_prefix_caching``), not computed.
    num_cached_tokens: int = 0
    spec_stats: SpecDecodeRequestStats = field(default_factory=SpecDecodeRequestStats)
    #: Steps (target forwards after prefill) this request took part in.
    num_steps: int = 0
    #: What the drafter reported when the request finished (vLLM's name: ``extract_hidden_states``
    #: puts ``{"hidden_states_path": ...}`` here); ``None`` otherwise.
    kv_transfer_params: dict[str, Any] | None = None
    #: When its tokens came (``RequestMetrics``).
    metrics: RequestMetrics | None = None

    @property
    def num_draft_tokens(self) -> int:
        return self.spec_stats.num_draft_tokens

    @property
    def num_accepted_tokens(self) -> int:
        return self.spec_stats.num_accepted_tokens
