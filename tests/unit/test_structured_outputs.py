"""Structured outputs under speculation (issue 40, item 2; ``engine/structured.py``): every drafter's
greedy output equals constrained plain decoding token for token, for each kind of constraint in one
mixed batch; drafts the grammar forbids are cut before verification (placeholders, not counted as
drafted); drafts that follow the grammar are accepted; an output whose grammar ends inside a draft ends
there; sampled outputs keep plain constrained decoding's law (two-sample chi-squared, with a negative
control the test detects); bad constraints are refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import one_thread  # noqa: F401  (module fixture: one intra-op thread)
from test_engine_context_limit import SPECS
from test_engine_graphs import SimulatedGraphBackend, forwards

from spec_backend.engine import LLM, SamplingParams, StructuredOutputsParams
from spec_backend.tools.tiny import make_tiny_model

pytest.importorskip("llguidance", reason="structured outputs need llguidance (the structured extra)")

EOS = 1
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "w": {"type": "string", "maxLength": 6}},
    "required": ["n", "w"],
}
CHOICES = ["yes", "yeah", "no", "nope", "maybe"]
REGEX = r"[a-c]{2,5}-[0-9]{1,3}"
LARK = 'start: "(" item ("," item)~0..3 ")"\nitem: /[xyz]/'
GBNF = 'root ::= "<" [a-e]{1,4} ">"'
#: each constraint and a check of its finished text
KINDS: dict[str, tuple[dict[str, Any], Any]] = {
    "json": ({"json": SCHEMA, "disable_any_whitespace": True}, lambda t: set(json.loads(t)) == {"n", "w"}),
    "json_object": ({"json_object": True, "disable_any_whitespace": True}, lambda t: json.loads(t) == {}),
    "regex": ({"regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
    "choice": ({"choice": CHOICES}, lambda t: t in CHOICES),
    "lark": ({"grammar": LARK}, lambda t: re.fullmatch(r"\([xyz](,[xyz]){0,3}\)", t)),
    "gbnf": ({"grammar": GBNF}, lambda t: re.fullmatch(r"<[a-e]{1,4}>", t)),
}
PROMPTS = ["abc abc abc", '{"n": 1}', "yes no yes", "aa-1 bb-2", "(x,y)", "<ab>"]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama with its character-level tokenizer and EOS = 1."""
    return make_tiny_model(
        tmp_path_factory.mktemp("structured"), "llama", with_tokenizer=True, eos_token_id=EOS
    )


def _params(kind: str, **extra: Any) -> SamplingParams:
    spec = StructuredOutputsParams(**KINDS[kind][0])
    return SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=spec, **extra)


def _batch() -> tuple[list[str], list[SamplingParams]]:
    """One request per kind of constraint, and one unconstrained."""
    kinds = list(KINDS)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(kinds))] + ["free text"]
    return prompts, [_params(k) for k in kinds] + [SamplingParams(temperature=0.0, max_tokens=12)]


@pytest.fixture(scope="module")
def plain(target: str) -> list[list[int]]:
    prompts, params = _batch()
    outputs = [o.outputs[0] for o in LLM(target, dtype="float64").generate(prompts, params)]
    for (kind, (_, valid)), out in zip(KINDS.items(), outputs, strict=False):
        assert out.finish_reason == "stop" and out.token_ids[-1] == EOS, (kind, out.text)
        assert valid(out.text), (kind, out.text)
    return [o.token_ids for o in outputs]


@pytest.mark.parametrize("method", sorted(set(SPECS) - {"ngram_gpu"}))
def test_greedy_output_equals_constrained_plain_decoding(
    method: str, target: str, plain: list[list[int]], tmp_path: Path
) -> None:
    llm = LLM(target, dtype="float64", speculative_config=SPECS[method](target, tmp_path))
    prompts, params = _batch()
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == plain


@pytest.mark.parametrize("method", ["ngram", "draft_model(self)"])
def test_the_captured_step_equals_constrained_plain_decoding(
    method: str, target: str, plain: list[list[int]], tmp_path: Path
) -> None:
    """With graph capture (the simulated driver: every request widened to K+1 rows, placeholders past
    its drafts) the grammar's cuts and row masks land on the right rows too."""
    backend = SimulatedGraphBackend()
    spec = SPECS[method](target, tmp_path)
    llm = LLM(target, dtype="float64", speculative_config=spec, backend=backend, max_num_seqs=8)
    prompts, params = _batch()
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
    plain = llm.engine.captured_plain.graph if llm.engine.captured_plain else None
    steps = forwards(llm, backend)  # the samplers' graphs replay by the batch's kind
    assert all(r.replays > 0 for r in steps if r is not plain)  # the verify (and draft) steps


def test_unconstrained_output_differs(target: str, plain: list[list[int]]) -> None:
    """Negative control: without the constraint the model writes something else."""
    prompts, _ = _batch()
    free = SamplingParams(temperature=0.0, max_tokens=48)
    got = [o.outputs[0].token_ids for o in LLM(target, dtype="float64").generate(prompts[:-1], free)]
    assert all(g != p for g, p in zip(got, plain, strict=False))


class _Recorder:
    """Wraps an engine's sampler and keeps the draft ids each verification received."""

    def __init__(self, llm: LLM) -> None:
        self.drafts: list[list[int]] = []
        sampler = llm.engine.verifier.sampler
        self._call = sampler.__call__
        llm.engine.verifier.sampler = self  # type: ignore[assignment]

    def __call__(self, metadata: Any, *args: Any) -> Any:
        self.drafts.append(metadata.draft_token_ids.tolist())
        return self._call(metadata, *args)


def test_forbidden_drafts_are_cut_before_verification(target: str) -> None:
    """The regex forces ``abcabcabcabc``. From the prompt ``abcabx`` ngram drafts ``b x ?`` after the
    first ``a``: the ``x`` breaks the grammar, so it and what follows become placeholders (-1) before the
    sampler sees them, and are not counted as drafted; at the end the grammar allows only EOS, so the
    draft's ``a`` after ``...abc`` is cut too. Every draft that reaches the sampler is accepted."""
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 1,
    }
    llm = LLM(target, dtype="float64", speculative_config=spec)
    recorder = _Recorder(llm)
    params = SamplingParams(
        temperature=0.0, max_tokens=20, structured_outputs=StructuredOutputsParams(regex="(abc){4}")
    )
    out = llm.generate(["abcabx"], params)[0].outputs[0]
    assert out.text == "abcabcabcabc" and out.token_ids[-1] == EOS
    tok = llm.tokenizer
    assert tok is not None
    a, b, c = (tok.convert_tokens_to_ids(ch) for ch in "abc")
    assert recorder.drafts == [[], [b, -1, -1], [a, b, -1, -1], [a, b, c], [b, c, -1]]
    stats = llm.metrics.total
    assert stats.num_draft_tokens == stats.num_accepted_tokens == 8


def test_an_output_that_ends_inside_a_draft_stops_there(target: str) -> None:
    """Reasoning-style: the grammar ends after ``</think>yes`` while ngram's draft goes on copying the
    prompt (``<think>`` again): the drafts past the end are cut, the output ends with EOS right there,
    equal to plain decoding."""
    regex = r"<think>[a-z ]{0,12}</think>(yes|no)"
    params = SamplingParams(
        temperature=0.0, max_tokens=60, structured_outputs=StructuredOutputsParams(regex=regex)
    )
    prompt = "<think>ok</think>yes<think>ok</think>yes<think>"
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 6,
        "prompt_lookup_min": 2,
    }
    plain = LLM(target, dtype="float64").generate([prompt], params)[0].outputs[0]
    out = LLM(target, dtype="float64", speculative_config=spec).generate([prompt], params)[0].outputs[0]
    assert out.token_ids == plain.token_ids and out.finish_reason == "stop"
    assert re.fullmatch(regex, out.text) and out.token_ids[-1] == EOS


def test_constraints_are_refused_by_name(target: str) -> None:
    with pytest.raises(ValueError, match="exactly one of json, regex, choice, grammar, json_object"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="choice must be a non-empty list of non-empty strings, got"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="disable_any_whitespace applies to json and json_object, got regex"):
        StructuredOutputsParams(regex="a", disable_any_whitespace=True)
    with pytest.raises(ValueError, match="does not take whitespace_pattern"):
        SamplingParams(structured_outputs={"json": SCHEMA, "whitespace_pattern": " "})
    with pytest.raises(ValueError, match="ignore_eos=True cannot be combined with structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"}, ignore_eos=True)
    with pytest.raises(ValueError, match=r"guided_decoding \(vLLM's former name: pass structured_outputs"):
        SamplingParams(guided_decoding={"regex": "a"})
    llm = LLM(target, dtype="float64")
    with pytest.raises(ValueError, match=r"structured_outputs\.regex does not compile"):
        llm.generate(["x"], SamplingParams(structured_outputs={"regex": "(a"}))
    with pytest.raises(ValueError, match=r"structured_outputs\.grammar does not compile"):
        llm.generate(["x"], SamplingParams(structured_outputs={"grammar": "start: nothing_defined"}))
    assert llm.generate(["x"], SamplingParams(max_tokens=2))  # the engine is still usable


def test_a_model_without_eos_or_tokenizer_is_refused(tmp_path: Path) -> None:
    params = SamplingParams(structured_outputs={"regex": "a+"})
    no_eos = make_tiny_model(tmp_path / "no_eos", "llama", with_tokenizer=True)
    llm = LLM(no_eos, dtype="float64")
    llm.eos_token_ids = frozenset()  # the tokenizer names one; a model may have none at all
    with pytest.raises(ValueError, match="structured_outputs needs an EOS token"):
        llm.generate(["x"], params)
    bare = LLM(make_tiny_model(tmp_path / "bare", "llama"), dtype="float64")
    with pytest.raises(ValueError, match="structured_outputs needs the model's tokenizer"):
        bare.generate([[5, 6]], params)


#: samples per engine in the law tests; seeds are fixed, so the tests' outcomes are too
SAMPLES = 400
#: the p-value below which two samples are called different (a false alarm on 0.1% of seed sets)
ALPHA = 1e-3
#: three printable characters up to ``w``: most of a random model's drafts fit, some are cut
PRINTABLE = r"[ -w]{3}"


def _sampled(llm: LLM, structured: dict[str, Any], prompt: str, temperature: float = 1.0) -> list[list[int]]:
    params = [
        SamplingParams(temperature=temperature, seed=1000 + i, max_tokens=8, structured_outputs=structured)
        for i in range(SAMPLES)
    ]
    return [o.outputs[0].token_ids for o in llm.generate([prompt] * SAMPLES, params)]


def _different(first: list[int], second: list[int]) -> float:
    """The two-sample chi-squared p-value of two category counts (empty categories dropped)."""
    from scipy.stats import chi2_contingency

    seen = [i for i, (x, y) in enumerate(zip(first, second, strict=True)) if x + y]
    return float(chi2_contingency([[first[i] for i in seen], [second[i] for i in seen]]).pvalue)


def test_seeded_samples_with_ngram_drafts_are_plain_decodings_own(target: str) -> None:
    """With point-mass drafts a seeded request's tokens are those of plain constrained decoding, sample
    for sample (the sampler's counter-based race at each position), while drafts are accepted; every
    output is one of the choices."""
    prompt = "yes yeah nope maybe no "
    plain = _sampled(LLM(target, dtype="float64", max_num_seqs=64), {"choice": CHOICES}, prompt)
    spec = {
        "adaptive_draft_length": False,
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
    }
    speculative = LLM(target, dtype="float64", max_num_seqs=64, speculative_config=spec)
    assert _sampled(speculative, {"choice": CHOICES}, prompt) == plain
    assert speculative.metrics.total.num_accepted_tokens > 0
    tok = speculative.tokenizer
    assert tok is not None
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in plain]
    assert set(texts) <= set(CHOICES) and len(set(texts)) >= 3


def test_sampled_outputs_with_probabilistic_drafts_keep_the_law(target: str) -> None:
    """The target drafting for itself at temperature 1 (drafts drawn from its unconstrained
    distribution, cut where they leave the grammar) against plain constrained decoding, on a
    three-character grammar: the second and third characters binned by id mod 4 (16 cells) cannot be
    told apart by a two-sample chi-squared test; negative control: the same test tells plain decoding at
    temperature 1 from temperature 0.1."""
    grammar = {"regex": PRINTABLE}

    def cells(outputs: list[list[int]]) -> list[int]:
        keys = [4 * (ids[1] % 4) + ids[2] % 4 for ids in outputs]
        return [keys.count(k) for k in range(16)]

    plain_llm = LLM(target, dtype="float64", max_num_seqs=64)
    plain = _sampled(plain_llm, grammar, "abc")
    spec = {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": target,
        "num_speculative_tokens": 2,
    }
    speculative = LLM(target, dtype="float64", max_num_seqs=64, speculative_config=spec)
    got = _sampled(speculative, grammar, "abc")
    stats = speculative.metrics.total
    assert stats.num_accepted_tokens > 0 and got != plain  # drafts act, and the random numbers differ
    assert all(len(ids) == 4 and ids[-1] == EOS for ids in got + plain)
    assert _different(cells(plain), cells(got)) > ALPHA
    colder = _sampled(plain_llm, grammar, "abc", temperature=0.1)
    assert _different(cells(plain), cells(colder)) < ALPHA


def test_the_bitmask_unpacks_bit_by_bit() -> None:
    """Bit ``t % 32`` of word ``t // 32`` allows token ``t``, the sign bit included; columns past the
    bitmask (embedding rows the tokenizer lacks) are not allowed."""
    import torch

    from spec_backend.engine.structured import unpack_bitmask

    bits = torch.tensor([[1 | (1 << 5), -(2**31)], [0, 1 << 3]], dtype=torch.int32)  # [2, 2]: 64 tokens
    allowed = unpack_bitmask(bits, 70)  # [2, 70]
    assert [row.nonzero().flatten().tolist() for row in allowed] == [[0, 5, 63], [35]]
    assert unpack_bitmask(bits, 40).shape == (2, 40)
