"""Stop checks of one request: stop strings, stop token ids, EOS, max_tokens (no model needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spec_backend.engine import request as request_module
from spec_backend.engine.params import SamplingParams
from spec_backend.engine.request import Request


class CharTokenizer:
    """Token id i decodes to chr(ord('a') + i); id 25 ('z') is 'special' and skipped."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == 25))


NO_LIMIT = 1 << 30  # max_len where the context limit is not what a test is about


def make(params: SamplingParams, eos: frozenset[int] = frozenset({25})) -> Request:
    return Request("0", None, [0, 1], params, seed=1, eos_token_ids=eos)


def test_stop_string_cuts_text_and_keeps_tokens_up_to_it() -> None:
    r = make(SamplingParams(max_tokens=20, stop=["cd", "x"]))
    kept = r.append_tokens(
        [0, 1, 2, 3, 4, 5], CharTokenizer(), NO_LIMIT
    )  # "abcdef": "cd" completes at token 3
    assert kept == [0, 1, 2, 3]
    assert r.finish_reason == "stop" and r.stop_reason == "cd"
    out = r.to_output(CharTokenizer())
    assert out.outputs[0].text == "ab" and out.outputs[0].token_ids == [0, 1, 2, 3]


def test_eos_inside_accepted_tokens_truncates() -> None:
    r = make(SamplingParams(max_tokens=20))
    assert r.append_tokens([3, 25, 4], CharTokenizer(), NO_LIMIT) == [3, 25]
    assert r.finish_reason == "stop" and r.to_output(CharTokenizer()).outputs[0].text == "d"
    ignoring = make(SamplingParams(max_tokens=20, ignore_eos=True))
    assert (
        ignoring.append_tokens([3, 25, 4], CharTokenizer(), NO_LIMIT) == [3, 25, 4] and not ignoring.finished
    )


def test_stop_token_ids_and_max_tokens() -> None:
    r = make(SamplingParams(max_tokens=20, stop_token_ids=[7]))
    assert r.append_tokens([1, 7, 2], None, NO_LIMIT) == [1, 7] and r.stop_reason == 7
    r = make(SamplingParams(max_tokens=3))
    assert r.append_tokens([1, 2], None, NO_LIMIT) == [1, 2] and not r.finished
    assert r.append_tokens([3, 4, 5], None, NO_LIMIT) == [3] and r.finish_reason == "length"


def test_the_context_limit_truncates_like_max_tokens() -> None:
    """``max_len`` bounds prompt + output: the tokens past it are not kept, the reason is "length"."""
    r = make(SamplingParams(max_tokens=20))  # a 2-token prompt
    assert r.append_tokens([1, 2], None, 5) == [1, 2] and not r.finished
    assert r.append_tokens([3, 4, 5], None, 5) == [3] and r.finish_reason == "length"
    assert r.num_tokens == 5


def test_acceptance_counters() -> None:
    r = make(SamplingParams())
    r.record_verification(4, 2)
    r.record_verification(0, 0)
    r.record_verification(3, 3)
    s = r.stats
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 7, 5)
    assert s.accepted_per_position == [2, 2, 1, 0] and r.num_steps == 3
    assert s.mean_acceptance_length == 3.5


def test_failed_request_output() -> None:
    r = make(SamplingParams())
    r.append_tokens([1], None, NO_LIMIT)
    r.fail("boom")
    out = r.to_output(None)
    assert out.outputs[0].finish_reason == "error" and out.outputs[0].error == "boom"
    assert out.outputs[0].token_ids == [1]


def test_metrics_time_the_first_and_last_kept_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 10.5, 11.0, 12.5])  # arrival, then one reading per append_tokens call
    monkeypatch.setattr(request_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    r = make(SamplingParams(max_tokens=6))
    assert r.metrics.arrival_time == 10.0 and r.metrics.decode_tokens_per_s is None
    r.append_tokens([1], None, NO_LIMIT)  # the prefill's token
    assert r.metrics.first_token_time == r.metrics.last_token_time == 10.5
    assert r.metrics.decode_tokens_per_s is None  # no time after the first token yet
    r.append_tokens([2, 3], None, NO_LIMIT)
    r.append_tokens([4, 5, 6, 7], None, NO_LIMIT)  # max_tokens keeps 3 of these 4
    out = r.to_output(None)
    assert out.metrics is r.metrics and out.metrics.num_output_tokens == 6 == len(out.outputs[0].token_ids)
    assert out.metrics.last_token_time == 12.5
    assert out.metrics.decode_tokens_per_s == 5 / 2.0  # 5 tokens after the first, in 2 s
