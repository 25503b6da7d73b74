"""Where and how the cpu backend's kernels are built (``cpu/native.py``): a build interrupted in the
middle leaves torch's ``lock`` file behind, and the next process must build again instead of waiting for
it forever; two Python environments (``.venv`` and ``.venv-eval``) build in two folders instead of
rebuilding each other's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_fixtures import require_native_kernels

from spec_backend.cpu import native
from spec_backend.paths import CACHE_ENV

#: seconds a load of built kernels may take in a fresh process (an import of torch and a no-op ninja)
LOAD_LIMIT = 300


def _load_in_a_fresh_process(cache: Path, name: str) -> str:
    """``variant_error(name)`` in a new interpreter whose cache root is ``cache``; a process that does not
    finish within ``LOAD_LIMIT`` seconds is killed, and the test fails."""
    env = {**os.environ, CACHE_ENV: str(cache)}
    code = f"from spec_backend.cpu.native import variant_error; print(variant_error({name!r}))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=LOAD_LIMIT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading the {name} kernels waited {LOAD_LIMIT} s (for a lock no one holds)")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_lock_left_by_an_interrupted_build_does_not_stall_the_next_process(tmp_path: Path) -> None:
    require_native_kernels()
    chosen = native.selection().variant
    assert chosen is not None, native.selection().reason
    built = native.build_folder(chosen)  # built in this session's cache by the call above
    folder = tmp_path / "kernels" / built.name
    shutil.copytree(built, folder)  # the same digest: this interpreter, these sources
    (folder / "lock").touch()  # what a killed build leaves: torch waits while it exists
    assert _load_in_a_fresh_process(tmp_path, chosen.name) == "None"
    assert not (folder / "lock").exists()


def test_each_python_environment_builds_in_its_own_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The build folder's digest covers the headers compiled against (torch's folder, Python's include
    folder): torch's build file names them, so one folder shared by two environments was rebuilt by
    each in turn."""
    chosen = native.variant("generic")
    here = native.build_folder(chosen)
    assert str(Path(native.torch.__file__).parent) in native.toolchain()
    monkeypatch.setattr(
        native, "toolchain", lambda: "/other/venv/lib/python3.11/site-packages/torch|/usr/include"
    )
    there = native.build_folder(chosen)
    assert there != here and there.parent == here.parent
    assert there.name.startswith("generic-")
