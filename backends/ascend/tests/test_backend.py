"""Probe, import hygiene and the parts the Ascend backend hands out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import ModuleType

import pytest
from spec_backend_ascend import AscendBackend
from spec_backend_ascend.graph_runner import AclGraphRunner

from spec_backend.backends import BackendNotImplementedError


def test_probe_with_the_fake_present_is_available(fake_npu: ModuleType) -> None:
    status = AscendBackend().probe()
    assert status.available, str(status)
    assert str(status) == "available"


def test_probe_without_torch_npu_reports_the_reason() -> None:
    assert str(AscendBackend().probe()).startswith("unavailable: torch_npu is not installed")


def test_importing_and_listing_never_imports_torch_npu() -> None:
    """A fresh interpreter: import the package, list and probe every backend, touch the cheap parts."""
    code = textwrap.dedent(
        """
        import sys
        import spec_backend_ascend
        from spec_backend.backends import list_backends
        infos = {i.name: i for i in list_backends()}
        assert not infos["ascend"].available, infos["ascend"].reason
        backend = spec_backend_ascend.AscendBackend()
        backend.token_limits(); backend.capture_policy(32); backend.sampler_tuning(); backend.describe()
        assert "torch_npu" not in sys.modules, "torch_npu was imported"
        print("ok", infos["ascend"].reason)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok torch_npu is not installed")


def test_device_parts_with_the_fake(fake_npu: ModuleType) -> None:
    backend = AscendBackend()
    assert isinstance(backend.graph_runner(lambda x: x, [16, 32]), AclGraphRunner)
    tuning = backend.sampler_tuning()
    assert (tuning.vocab_block, tuning.max_grid, tuning.device_uniforms) == (2048, 40, False)


def test_sampler_ops_refuse_until_the_shared_kernels_exist() -> None:
    with pytest.raises(BackendNotImplementedError, match="sampler ops"):
        AscendBackend().sampler_ops()
