"""``benchmarks/bench_adaptive.py --lockstep``: engines that take one prompt together, a step each in turn,
give each its own output and time only their decode steps."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import PROMPTS, one_thread  # noqa: F401 - autouse

from spec_backend.engine import LLM, SamplingParams
from spec_backend.tools.tiny import make_tiny_model


def _bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_adaptive.py"
    spec = importlib.util.spec_from_file_location("bench_adaptive", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engines_in_lockstep_give_each_its_own_output(tmp_path_factory: pytest.TempPathFactory) -> None:
    target = make_tiny_model(tmp_path_factory.mktemp("lockstep"), "llama", with_tokenizer=True)
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    engines = {
        "plain": LLM(target, dtype="float64"),
        "ngram": LLM(target, dtype="float64", speculative_config=ngram),
    }
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    bench = _bench()
    start = time.perf_counter()
    got = bench.in_lockstep(engines, PROMPTS[0], greedy)
    wall = time.perf_counter() - start
    alone = engines["plain"].generate([PROMPTS[0]], greedy)[0].outputs[0].text
    for name in ("plain", "ngram"):
        text, tokens, seconds = got[name]
        assert text == alone and tokens == 11 and seconds > 0.0  # every token but the prefill's
    # each engine's own steps were timed, never the other's: their sums fit in the run's wall time
    assert got["ngram"][2] + got["plain"][2] <= wall
    assert not any(llm.engine.has_unfinished() for llm in engines.values())
