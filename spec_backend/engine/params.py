"""User-facing request types: ``SamplingParams`` in, ``RequestOutput`` out (vLLM's offline shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from spec_backend.metrics import SpecDecodingStats
from spec_backend.sampling.metadata import check_seed

FinishReason = Literal["stop", "length", "error"]


@dataclass
class SamplingParams:
    """How to sample one request; validated on construction (``ValueError`` naming the field).

    ``temperature`` 0 is greedy; ``top_k`` 0 disables top-k; ``top_p`` 1.0 disables nucleus sampling;
    ``seed`` (None, or an int in [0, 2**63 - 1]; vLLM's ``-1`` for "unseeded" is refused: pass None) makes
    the request's samples reproducible whatever else is in the batch; ``max_tokens`` caps
    generated tokens; ``stop`` strings end generation (excluded from the text); ``stop_token_ids`` end it
    (included in ``token_ids``); ``ignore_eos`` keeps going past the model's end-of-sequence token.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not 0.0 <= float(self.temperature) < float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        self.temperature = float(self.temperature)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {self.top_k!r}")
        if (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, int | float)
            or not 0.0 < self.top_p <= 1.0
        ):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        self.top_p = float(self.top_p)
        check_seed(self.seed)  # None or [0, 2**63 - 1]: every accepted seed is reproducible
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            if not all(isinstance(s, str) and s for s in self.stop):
                raise ValueError(
                    f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r}"
                )
            self.stop = list(self.stop)
        if self.stop_token_ids is not None:
            ids = list(self.stop_token_ids)
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise ValueError(f"stop_token_ids must be ints >= 0, got {self.stop_token_ids!r}")
            self.stop_token_ids = ids
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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


@dataclass
class RequestOutput:
    """The result for one prompt, in the order the prompts were given."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    spec_stats: SpecDecodeRequestStats = field(default_factory=SpecDecodeRequestStats)
    #: Steps (target forwards after prefill) this request took part in.
    num_steps: int = 0
    #: What the drafter reported when the request finished (vLLM's name: ``extract_hidden_states``
    #: puts ``{"hidden_states_path": ...}`` here); ``None`` otherwise.
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def num_draft_tokens(self) -> int:
        return self.spec_stats.num_draft_tokens

    @property
    def num_accepted_tokens(self) -> int:
        return self.spec_stats.num_accepted_tokens
