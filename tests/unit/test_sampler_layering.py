"""Layering: the sampler never imports the backend package nor runs plugin discovery; it takes any
``SamplerBackend`` object, or None for the pure-torch reference ops, and refuses a backend name."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import spec_backend.sampling
from spec_backend.backends import base
from spec_backend.backends.reference import ReferenceBackend
from spec_backend.sampling import RejectionSampler, SamplingMetadata, SpecDecodeMetadata
from spec_backend.sampling import tuning as sampling_tuning
from spec_backend.sampling.torch_ops import TorchSamplerOps

SAMPLING_DIR = Path(spec_backend.sampling.__file__).parent

#: prints which backend-package / discovery modules are loaded after ``{setup}``
PROBE = """
import json, sys
{setup}
print(json.dumps(sorted(m for m in sys.modules
                        if m == "stevedore" or m.startswith(("stevedore.", "spec_backend.backends")))))
"""


def _loaded_after(setup: str) -> list[str]:
    code = PROBE.format(setup=setup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_building_a_sampler_imports_no_backend_module_and_no_stevedore() -> None:
    setup = (
        "import spec_backend.sampling as s\n"
        "sampler = s.RejectionSampler()\n"
        "sampler(s.SpecDecodeMetadata.from_draft_tokens([[1]]), None, __import__('torch').zeros(2, 4),"
        " s.SamplingMetadata.random(1, seed=0))"
    )
    assert _loaded_after(setup) == []


def test_the_import_probe_sees_discovery_when_it_happens() -> None:
    """Negative control: the same probe reports the loader and stevedore once discovery is imported."""
    loaded = _loaded_after("import spec_backend.backends")
    assert "spec_backend.backends.loader" in loaded and "stevedore" in loaded


def _backend_imports(source: str) -> list[str]:
    """Every import of ``spec_backend.backends`` in ``source``, at any depth (function-local included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spec_backend.backends"):
            found.append(str(node.module))
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("spec_backend.backends")]
    return found


def test_no_sampling_module_imports_the_backend_package() -> None:
    offenders = {
        path.relative_to(SAMPLING_DIR).as_posix(): _backend_imports(path.read_text())
        for path in sorted(SAMPLING_DIR.rglob("*.py"))
    }
    assert "triton/ops.py" in offenders  # the scan reaches the subpackages
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_the_import_scan_finds_a_function_local_import() -> None:
    """Negative control for the scan above."""
    source = (
        "def f():\n"
        "    from spec_backend.backends.base import SamplerTuning\n"
        "    import spec_backend.backends\n"
    )
    assert _backend_imports(source) == ["spec_backend.backends.base", "spec_backend.backends"]


def test_tuning_and_bound_are_one_object_re_exported_by_the_backend_contract() -> None:
    assert base.SamplerTuning is sampling_tuning.SamplerTuning
    assert base.MAX_SPEC_TOKENS == sampling_tuning.MAX_SPEC_TOKENS == 128


def test_no_backend_means_the_torch_reference_ops_and_default_tuning() -> None:
    sampler = RejectionSampler()
    assert sampler.backend is None and isinstance(sampler.ops, TorchSamplerOps)
    assert sampler.group_elements is None and sampler.max_spec_tokens == 128
    md = SpecDecodeMetadata.from_draft_tokens([[1] * 129])
    with pytest.raises(ValueError, match=r"limit of 128 .* backend 'torch reference ops'"):
        sampler(md, None, torch.zeros(130, 4), SamplingMetadata.random(1, seed=0))


@pytest.mark.parametrize("name", ["reference", "cuda"])
def test_a_backend_name_is_refused_with_the_way_to_load_it(name: str) -> None:
    with pytest.raises(TypeError, match=rf"backend name is not accepted.*load_backend\('{name}'\)"):
        RejectionSampler(backend=name)  # type: ignore[arg-type]


def test_an_object_without_the_protocol_is_refused() -> None:
    with pytest.raises(TypeError, match=r"needs an object with name, sampler_ops\(\).*got int: 3"):
        RejectionSampler(backend=3)  # type: ignore[arg-type]


class _DuckBackend:
    """Satisfies ``SamplerBackend`` without deriving from ``Backend``."""

    name = "duck"

    def sampler_ops(self) -> Any:
        return TorchSamplerOps()

    def sampler_tuning(self) -> sampling_tuning.SamplerTuning:
        return sampling_tuning.SamplerTuning(group_elements=8)

    def token_limits(self) -> base.TokenLimits:
        return base.TokenLimits(max_speculative_tokens=2)


def test_any_object_with_the_protocol_is_a_backend() -> None:
    sampler = RejectionSampler(backend=_DuckBackend())
    assert (sampler.group_elements, sampler.max_spec_tokens, sampler.backend_name) == (8, 2, "duck")
    md = SpecDecodeMetadata.from_draft_tokens([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"limit of 2 speculative tokens .* backend 'duck'"):
        sampler(md, None, torch.zeros(4, 4), SamplingMetadata.random(1, seed=0))


def test_no_backend_gives_the_reference_backends_tokens() -> None:
    """Same ops, same output: the reference backend and no backend agree (grouping changes nothing)."""
    md = SpecDecodeMetadata.from_draft_tokens([[1, 2], [3], [0, 0, 1]])
    logits = torch.randn(md.num_tokens + 3, 7, generator=torch.Generator().manual_seed(5))
    sampling = SamplingMetadata.random(3, seed=11)
    want = RejectionSampler(backend=ReferenceBackend())(md, None, logits, sampling)
    assert torch.equal(RejectionSampler()(md, None, logits, sampling), want)
