"""n-gram proposers (host and batched tensor) and the registry's host proposer builder."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spec_backend.config import SpeculativeConfig
from spec_backend.proposers import NgramGpuProposer, NgramProposer, Proposer, SuffixProposer
from spec_backend.proposers import ngram as ngram_module
from spec_backend.proposers import ngram_gpu as ngram_gpu_module
from spec_backend.proposers.ngram import last_occurrence
from spec_backend.proposers.ngram_gpu import ngram_match
from spec_backend.proposers.registry import build_proposer


def reference(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """The specification, by brute force: most recent earlier match of the longest suffix n-gram."""
    for n in range(n_max, n_min - 1, -1):
        for s in range(len(tokens) - n - 1, -1, -1):
            if tokens[s : s + n] == tokens[len(tokens) - n :]:
                return tokens[s + n : s + n + k]
    return []


def both(k: int, n_min: int, n_max: int) -> list[Proposer]:
    return [NgramProposer(k, n_min, n_max), NgramGpuProposer(k, n_min, n_max, device="cpu")]


@pytest.mark.parametrize(
    ("tokens", "k", "n_min", "n_max", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 3, 2, 3, [3, 4, 1]),  # n = 2 matches at 0
        ([1, 2, 7, 1, 2, 8, 1, 2], 3, 2, 2, [8, 1, 2]),  # the most recent occurrence wins
        ([3, 1, 2, 9, 0, 1, 2, 7, 3, 1, 2], 3, 2, 3, [9, 0, 1]),  # the longest n wins over recency
        ([1, 2, 3, 1, 2], 8, 1, 2, [3, 1, 2]),  # clipped at the end of the history
        ([5, 5, 5, 5], 4, 1, 3, [5]),  # the latest earlier occurrence leaves one token
        ([1, 2, 3, 4], 3, 1, 3, []),  # no repeat
        ([], 3, 1, 3, []),  # empty history
        ([7], 3, 1, 1, []),  # a single token has no earlier occurrence
        ([1, 2], 3, 3, 4, []),  # prompt shorter than n
        ([4, 9, 4], 1, 1, 2, [9]),  # K = 1
    ],
)
def test_known_proposals(tokens: list[int], k: int, n_min: int, n_max: int, expected: list[int]) -> None:
    assert reference(tokens, k, n_min, n_max) == expected
    for proposer in both(k, n_min, n_max):
        proposer.add_request("r", tokens)
        assert proposer.propose(["r"]) == [expected], type(proposer).__name__


def test_update_max_tokens_and_batch() -> None:
    for proposer in both(4, 1, 3):
        proposer.add_request("a", [1, 2, 3, 4])
        proposer.add_request("b", [9, 8])
        assert proposer.propose(["a", "b"]) == [[], []]
        proposer.update("a", [1, 2])
        proposer.update("b", [9])
        proposer.update("b", [])
        assert proposer.propose(["b", "a"]) == [[8, 9], [3, 4, 1, 2]]
        assert proposer.propose(["a", "b"], max_tokens=[2, 0]) == [[3, 4], []]
        with pytest.raises(ValueError, match="max_tokens has 1 entries for 2 requests"):
            proposer.propose(["a", "b"], max_tokens=[1])
        proposer.remove_request("a")
        proposer.remove_request("a")  # unknown ids are ignored
        proposer.add_request("c", [6, 6])  # reuses the freed slot in ngram_gpu
        assert proposer.propose(["c", "b"]) == [[6], [8, 9]]
        assert proposer.propose([]) == []


def test_gpu_buffer_grows_past_its_capacity() -> None:
    proposer = NgramGpuProposer(3, 2, 2)
    host = NgramProposer(3, 2, 2)
    tokens = (np.arange(700) % 97).tolist()
    for p in (proposer, host):
        p.add_request("r", tokens[:10])
        for i in range(10, 700, 7):
            p.update("r", tokens[i : i + 7])
    assert proposer.propose(["r"]) == host.propose(["r"]) == [reference(tokens, 3, 2, 2)]


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens=0 must be >= 1"):
        NgramProposer(0, 1, 2)
    with pytest.raises(ValueError, match="prompt_lookup_min=3 <= prompt_lookup_max=2"):
        NgramGpuProposer(2, 3, 2)


histories = st.lists(st.integers(0, 3), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    tokens=histories,
    split=st.integers(0, 40),
    chunks=st.lists(st.integers(1, 4), min_size=1, max_size=8),
    k=st.integers(1, 5),
    n_min=st.integers(1, 3),
    extra=st.integers(0, 2),
    tiny_hash=st.booleans(),
    vectorised=st.booleans(),
)
def test_ngram_matches_reference_and_gpu(
    tokens: list[int],
    split: int,
    chunks: list[int],
    k: int,
    n_min: int,
    extra: int,
    tiny_hash: bool,
    vectorised: bool,
) -> None:
    """Host == tensor == brute force after every step, with forced hash collisions half the time, and the
    prompt indexed by the vectorised build or (short prompts) into the dynamic tier."""
    n_max = n_min + extra
    host, gpu = NgramProposer(k, n_min, n_max), NgramGpuProposer(k, n_min, n_max)
    if tiny_hash:
        host._mask = 0x7  # 3-bit keys: collisions everywhere, results must stay exact
    if vectorised:
        host._short = -1  # every prompt, however short, takes the vectorised build
    pos = min(split, len(tokens))
    host.add_request("r", tokens[:pos])
    gpu.add_request("r", tokens[:pos])
    i = 0
    while True:
        expected = reference(tokens[:pos], k, n_min, n_max)
        drafts = host.propose(["r"])
        assert drafts == gpu.propose(["r"]) == [expected]
        assert len(drafts[0]) <= k
        if drafts[0]:  # the draft continues an earlier occurrence of the context's last token
            window = [tokens[pos - 1], *drafts[0]]
            assert any(tokens[s : s + len(window)] == window for s in range(pos - 1))
        if pos >= len(tokens):
            break
        step = chunks[i % len(chunks)]
        host.update("r", tokens[pos : pos + step])
        gpu.update("r", tokens[pos : pos + step])
        pos, i = min(len(tokens), pos + step), i + 1


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=5),
    pad=st.integers(0, 6),
    k=st.integers(1, 5),
    n_min=st.integers(1, 4),
    extra=st.integers(0, 3),
    caps=st.lists(st.integers(0, 5), min_size=5, max_size=5),
    chunk_elements=st.sampled_from([1, 7, 64, 1 << 22]),
)
def test_batched_matches_equal_the_brute_force_row_by_row(
    rows: list[list[int]], pad: int, k: int, n_min: int, extra: int, caps: list[int], chunk_elements: int
) -> None:
    """``ngram_match`` over a padded batch of histories of different lengths (padding past each, of tokens
    that would match) gives each row the brute force's drafts, capped at its limit, whether it matches
    every n-gram length at once or a few at a time (``MATCH_CHUNK_ELEMENTS``: down to one, the loop)."""
    width = max(1, max(len(r) for r in rows) + pad)
    tokens = torch.ones((len(rows), width), dtype=torch.int32)  # padding: token 1, a frequent token
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
    lengths = torch.tensor([len(r) for r in rows])
    limits = torch.tensor([min(k, c) for c in caps[: len(rows)]])
    with mock.patch.object(ngram_gpu_module, "MATCH_CHUNK_ELEMENTS", chunk_elements):
        drafts, counts = ngram_match(tokens, lengths, limits, n_min, n_min + extra, k)
    for b, row in enumerate(rows):
        want = reference(row, k, n_min, n_min + extra)[: int(limits[b])]
        assert drafts[b, : int(counts[b])].tolist() == want


def test_dynamic_tier_is_merged_into_the_static_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ngram_module, "_MIN_DYNAMIC", 4)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, 300).tolist()
    proposer = NgramProposer(4, 2, 4)
    proposer.add_request("r", tokens[:50])
    for i in range(50, 300, 3):
        proposer.update("r", tokens[i : i + 3])
        index = proposer._reqs["r"]
        assert len(index.dyn) <= max(4, index.static.size // 2)
        assert proposer.propose(["r"]) == [reference(tokens[: i + 3], 4, 2, 4)]
    assert proposer.memory_bytes > 0


def test_a_short_prompt_is_indexed_in_the_dynamic_tier_and_a_long_one_vectorised() -> None:
    """A prompt of at most ``_MIN_DYNAMIC`` n-grams skips the vectorised build (its fixed numpy cost was
    ~0.7 ms at every admission); both give the brute force's drafts. Failed before: every prompt was
    built into the static tier."""
    rng = np.random.default_rng(1)
    for length, short in ((40, True), (400, False)):
        tokens = rng.integers(0, 8, length).tolist()
        proposer = NgramProposer(4, 1, 4)
        proposer.add_request("r", tokens)
        index = proposer._reqs["r"]
        assert (index.static.size == 0 and len(index.dyn) > 0) == short
        assert proposer.propose(["r"]) == [reference(tokens, 4, 1, 4)]
        proposer.add_request("a", np.asarray(tokens))  # an array prompt, on either path
        assert proposer.propose(["a"]) == [reference(tokens, 4, 1, 4)]


def test_last_occurrence() -> None:
    arr = np.array([1, 2, 1, 2, 1, 2])
    assert last_occurrence(arr, 2) == 2
    assert last_occurrence(arr, 6) == -1
    assert last_occurrence(np.array([], dtype=np.int32), 1) == -1


# ------------------------------------------------------------------------------------------- factory
def spec(**kw: object) -> SpeculativeConfig:
    return SpeculativeConfig.model_validate(kw)


def unchecked(**kw: object) -> SpeculativeConfig:
    """A config the validators never saw: what ``build_proposer`` itself refuses."""
    return SpeculativeConfig.model_construct(**kw)  # type: ignore[arg-type]


def test_build_proposer_builds_each_host_method() -> None:
    p = build_proposer(spec(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4))
    assert isinstance(p, NgramProposer)
    assert (p.num_speculative_tokens, p.prompt_lookup_min, p.prompt_lookup_max) == (3, 4, 4)
    p = build_proposer(spec(method="[ngram]", num_speculative_tokens=2))  # the config resolves the alias
    assert isinstance(p, NgramProposer) and (p.prompt_lookup_min, p.prompt_lookup_max) == (5, 5)
    g = build_proposer(
        spec(method="ngram_gpu", num_speculative_tokens=2, prompt_lookup_min=2), torch.device("cpu")
    )
    assert isinstance(g, NgramGpuProposer) and (g.prompt_lookup_min, g.prompt_lookup_max) == (2, 2)
    assert g.device.type == "cpu"
    s = build_proposer(spec(method="suffix", suffix_decoding_max_tree_depth=7))
    assert isinstance(s, SuffixProposer)
    assert (s.num_speculative_tokens, s.max_tree_depth, s.max_cached_requests) == (7, 7, 10000)


def test_build_proposer_reads_every_suffix_field() -> None:
    s = build_proposer(
        spec(
            method="suffix",
            num_speculative_tokens=5,
            suffix_decoding_max_tree_depth=12,
            suffix_decoding_max_cached_requests=3,
            suffix_decoding_max_spec_factor=2.0,
            suffix_decoding_min_token_prob=0.25,
        )
    )
    assert isinstance(s, SuffixProposer)
    assert (s.num_speculative_tokens, s.max_tree_depth, s.max_cached_requests) == (5, 12, 3)
    assert (s.max_spec_factor, s.min_token_prob) == (2.0, 0.25)
    suffix = build_proposer(spec(method="suffix", suffix_decoding_max_cached_requests=0))
    assert isinstance(suffix, SuffixProposer)
    assert (suffix.num_speculative_tokens, suffix.max_tree_depth, suffix.max_cached_requests) == (24, 24, 0)


def test_build_proposer_errors() -> None:
    with pytest.raises(
        ValueError, match=r"unknown speculative method 'bogus'; known methods: ngram, ngram_gpu"
    ):
        build_proposer(unchecked(method="bogus", num_speculative_tokens=2))
    with pytest.raises(ValueError, match="unknown speculative method None"):
        build_proposer(unchecked(method=None))
    for method in ("draft_model", "eagle", "eagle3", "mtp", "dflash", "medusa", "mlp_speculator"):
        with pytest.raises(
            ValueError, match=f"'{method}' drafts with a model, not a host proposer: build it"
        ):
            build_proposer(unchecked(method=method, num_speculative_tokens=2))
    with pytest.raises(ValueError, match="num_speculative_tokens is required for speculative method 'ngram'"):
        build_proposer(unchecked(method="ngram", num_speculative_tokens=None))
    with pytest.raises(ValueError, match=r"suffix_decoding_min_token_prob=1\.5 must be in"):
        build_proposer(spec(method="suffix").model_copy(update={"suffix_decoding_min_token_prob": 1.5}))
