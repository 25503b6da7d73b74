"""vllm-ascend as the platform: it replaces vLLM's rejection sampling and reads the same
``rejection_sampler_config`` key with other (lossy block) semantics, so the plugin refuses the key there.

vllm-ascend has no release for vLLM 0.32 on PyPI (its newest is 0.23.0.post1) and cannot import without
CANN, so the active platform is a stand-in class whose module is ``vllm_ascend.platform``, which is
what the plugin's check reads (``type(current_platform).__module__``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vllm_helpers import rsc, vllm_config

pytestmark = pytest.mark.vllm


@pytest.fixture
def ascend_platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import vllm.platforms as platforms
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    real = platforms.current_platform
    attrs = {"__module__": "vllm_ascend.platform", "device_name": "npu"}
    stand_in = type("NPUPlatform", (type(real),), attrs)
    monkeypatch.setattr(platforms, "_current_platform", stand_in())
    yield
    monkeypatch.setattr(platforms, "_current_platform", real)


def test_key_refused_on_vllm_ascend(ascend_platform: None) -> None:
    with pytest.raises(ValueError, match=r"read by both vllm-ascend .* VLLM_PLUGINS"):
        vllm_config(rsc(enable_block_verify=True))


def test_vllm_ascend_keys_refused_before_our_validation(ascend_platform: None) -> None:
    """A vllm-ascend-only value gets the ownership message, not a confusing validation error."""
    with pytest.raises(ValueError, match="read by both vllm-ascend"):
        vllm_config({"rejection_sampler_config": {"some_ascend_only_flag": 1}})


def test_inert_on_vllm_ascend_without_the_key(ascend_platform: None) -> None:
    config = vllm_config({"some_other_plugin": {"x": 1}})
    assert config.additional_config == {"some_other_plugin": {"x": 1}}


def test_other_platforms_keep_the_key() -> None:
    """Negative control: on vLLM's own CPU platform the key is ours."""
    from spec_backend.integrations.vllm_config_hook import platform_owning_rejection

    assert platform_owning_rejection() is None
    vllm_config(rsc(enable_block_verify=True))
