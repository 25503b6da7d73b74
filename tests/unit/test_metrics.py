"""Acceptance statistics, the log line and the Prometheus counters."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from spec_backend.metrics import SpecDecodingMetrics, SpecDecodingStats


def test_stats_accumulate_and_derive() -> None:
    s = SpecDecodingStats()
    s.observe(4, 2)
    s.observe(4, 4)
    s.observe(2, 0)
    s.observe(0, 0)  # no drafts: not a draft
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 10, 6)
    assert s.accepted_per_position == [2, 2, 1, 1]
    assert s.acceptance_rate == pytest.approx(0.6)
    assert s.mean_acceptance_length == pytest.approx(3.0)
    assert s.per_position_acceptance_rate == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    other = SpecDecodingStats()
    other.observe(5, 5)
    s.merge(other)
    assert s.accepted_per_position == [3, 3, 2, 2, 1] and s.num_drafts == 4
    assert "mean acceptance length" in s.log_line()
    assert s.as_dict()["num_accepted_tokens"] == 11
    with pytest.raises(ValueError):
        s.observe(2, 3)


def test_empty_stats() -> None:
    s = SpecDecodingStats()
    assert (
        s.acceptance_rate == 0.0 and s.mean_acceptance_length == 1.0 and s.per_position_acceptance_rate == []
    )


def test_prometheus_counters_on_own_registry() -> None:
    registry = CollectorRegistry()
    m = SpecDecodingMetrics(registry=registry, log_interval_s=None)
    m.observe_many([3, 3, 0], [1, 3, 0])
    value = registry.get_sample_value
    assert value("spec_backend_spec_decode_num_drafts_total") == 2
    assert value("spec_backend_spec_decode_num_draft_tokens_total") == 6
    assert value("spec_backend_spec_decode_num_accepted_tokens_total") == 4
    per_pos = "spec_backend_spec_decode_num_accepted_tokens_per_pos_total"
    assert value(per_pos, {"position": "0"}) == 2
    assert value(per_pos, {"position": "2"}) == 1
    assert m.total.num_accepted_tokens == 4
    for sample in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):  # vLLM's names, same values
        assert value(f"vllm:spec_decode_{sample}_total") == value(f"spec_backend_spec_decode_{sample}_total")
    for pos in ("0", "1", "2"):
        vllm_per_pos = value("vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": pos})
        assert vllm_per_pos == value(per_pos, {"position": pos}) > 0
    # two engines in one process do not collide on the default (private) registries
    SpecDecodingMetrics()
    SpecDecodingMetrics()


def test_a_step_counts_as_its_requests_one_by_one() -> None:
    """``observe_many`` adds a step's counts to the counters in a few increments: every sample (ours and
    vLLM's names, each position) equals recording its requests one at a time; a position nobody reached
    has no series; an impossible pair raises before anything is recorded."""
    steps = [([4, 4, 0, 2], [1, 4, 0, 0]), ([3], [3]), ([4, 1], [2, 1])]
    one, many = CollectorRegistry(), CollectorRegistry()
    singly = SpecDecodingMetrics(registry=one, log_interval_s=None)
    stepwise = SpecDecodingMetrics(registry=many, log_interval_s=None)
    for drafted, accepted in steps:
        for d, a in zip(drafted, accepted, strict=True):
            singly.observe(d, a)
        stepwise.observe_many(drafted, accepted)
    samples = [
        {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for m in r.collect()
            for s in m.samples
            if not s.name.endswith("_created")  # creation times
        }
        for r in (one, many)
    ]
    assert samples[0] == samples[1] and len(samples[0]) > 8
    per_pos = "spec_backend_spec_decode_num_accepted_tokens_per_pos_total"
    assert many.get_sample_value(per_pos, {"position": "3"}) == 1  # only the request that accepted 4
    assert many.get_sample_value(per_pos, {"position": "4"}) is None
    assert stepwise.total.accepted_per_position == [5, 3, 2, 1]
    assert stepwise.total.as_dict() == singly.total.as_dict()
    before = many.get_sample_value("spec_backend_spec_decode_num_drafts_total")
    with pytest.raises(ValueError, match="accepted 3 of 2"):
        stepwise.observe_many([2, 2], [1, 3])
    assert many.get_sample_value("spec_backend_spec_decode_num_drafts_total") == before
    assert stepwise.total.num_drafts == singly.total.num_drafts


def test_periodic_log_line(caplog: pytest.LogCaptureFixture) -> None:
    m = SpecDecodingMetrics(registry=CollectorRegistry(), log_interval_s=3600)
    m.observe(4, 2)
    assert m.maybe_log() is None  # interval not elapsed
    with caplog.at_level(logging.INFO, logger="spec_backend.metrics"):
        line = m.maybe_log(force=True)
    assert line is not None and "acceptance rate: 50.0%" in line
    assert "SpecDecoding metrics" in caplog.text
    assert m.maybe_log(force=True) is None  # window was reset


LOG_SCRIPT = """
import sys
from spec_backend.engine import LLM, SamplingParams
llm = LLM(sys.argv[1], speculative_config={"adaptive_draft_length": False, "method": "ngram",
          "num_speculative_tokens": 3, "prompt_lookup_max": 3}, log_stats_interval=1e-9)
llm.generate(["abcabcabcabc"], SamplingParams(temperature=0, max_tokens=24))
"""


@pytest.mark.parametrize("configure", ["1", "0"])
def test_speculation_log_line_shows_by_default(tmp_path: Path, configure: str) -> None:
    """With no logging set up by the application, the periodic line reaches stderr (as vLLM's does);
    SPEC_BACKEND_CONFIGURE_LOGGING=0 leaves logging alone (the negative control: nothing printed)."""
    import os
    import subprocess
    import sys

    from spec_backend.tools.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "m", vocab_size=128, with_tokenizer=True)
    env = {**os.environ, "SPEC_BACKEND_CONFIGURE_LOGGING": configure}
    out = subprocess.run([sys.executable, "-c", LOG_SCRIPT, model], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("[spec_backend.metrics] SpecDecoding metrics: mean acceptance length" in out.stderr) == (
        configure == "1"
    )
