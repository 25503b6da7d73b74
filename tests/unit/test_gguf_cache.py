"""The GGUF → safetensors cache: keyed by content, reused, atomic under concurrent first runs, and
rebuilt when a slot is damaged or holds another file's conversion.

The de-quantizing writer (transformers) is replaced by a stand-in that writes a one-tensor safetensors
file naming the GGUF in its metadata, so these tests exercise the cache's own logic; the real conversion
of the bundled model runs in the vLLM tier's set-up (``scripts/setup_vllm_env.sh``)."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spec_backend import paths
from spec_backend.engine import ModelLoadError
from spec_backend.runtime import gguf_cache


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "model" / "tiny.Q4_1.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(64)))
    return path


def fake_writer(calls: list[str], delay: float = 0.0) -> object:
    def write(directory: str, gguf_file: str, out: Path) -> None:
        import torch
        from safetensors.torch import save_file

        calls.append(threading.current_thread().name)
        time.sleep(delay)
        (out / "config.json").write_text("{}")
        save_file({"w": torch.zeros(4)}, str(out / "model.safetensors"), metadata={"gguf": gguf_file})

    return write


def weights_of(folder: Path) -> str:
    """The GGUF file name ``fake_writer`` recorded in the slot's safetensors metadata."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return str(f.metadata()["gguf"])


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(paths.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_root() == tmp_path / "xdg" / "spec_backend"
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "own"))
    assert paths.cache_root() == tmp_path / "own"


def test_written_once_then_reused(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gguf_cache, "_write_folder", fake_writer(calls))
    first = gguf_cache.materialize(str(gguf.parent), gguf.name)
    second = gguf_cache.materialize(str(gguf.parent), gguf.name)
    assert first == second and len(calls) == 1
    assert Path(first).name.startswith("tiny.Q4_1-") and (Path(first) / "model.safetensors").is_file()
    assert sorted(p.name for p in Path(first).parent.iterdir()) == [Path(first).name]  # no leftovers


def test_changed_file_gets_a_new_folder(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gguf_cache, "_write_folder", fake_writer(calls))
    before = gguf_cache.materialize(str(gguf.parent), gguf.name)
    gguf.write_bytes(gguf.read_bytes() + b"!")
    after = gguf_cache.materialize(str(gguf.parent), gguf.name)
    assert before != after and len(calls) == 2


def test_concurrent_first_runs_agree(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes (threads here) converting at once: both get the same complete folder and no
    partial folder is left behind."""
    calls: list[str] = []
    monkeypatch.setattr(gguf_cache, "_write_folder", fake_writer(calls, delay=0.2))
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(gguf_cache.materialize(str(gguf.parent), gguf.name)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1] and len(calls) == 2
    folder = Path(results[0])
    assert weights_of(folder) == gguf.name
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_failed_conversion_leaves_nothing(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(directory: str, gguf_file: str, out: Path) -> None:
        (out / "model.safetensors").write_text("half")
        raise RuntimeError("unsupported tensor type")

    monkeypatch.setattr(gguf_cache, "_write_folder", broken)
    with pytest.raises(RuntimeError, match="unsupported tensor type"):
        gguf_cache.materialize(str(gguf.parent), gguf.name)
    assert list((Path(paths.cache_root()) / "gguf").iterdir()) == []


def test_command_line_refuses_a_folder_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert gguf_cache.main([str(tmp_path)]) == 2
    assert "is not a GGUF model" in capsys.readouterr().err
    assert gguf_cache.main([]) == 2


def llama_gguf(path: Path) -> Path:
    """A GGUF header with a supported architecture (its tensors are never read: the writer is faked)."""
    gguf_lib = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf_lib.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_engine_loads_gguf_models_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLM(file.gguf)`` converts once; the second engine loads the cached folder, and both generate
    the same tokens (the folder stands in for the de-quantized GGUF)."""
    from spec_backend.engine import LLM, SamplingParams
    from spec_backend.tools.tiny import make_tiny_model

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    tiny = Path(make_tiny_model(tmp_path / "tiny", vocab_size=128, with_tokenizer=True))
    gguf = llama_gguf(tmp_path / "m.gguf")
    calls: list[str] = []

    def convert(directory: str, gguf_file: str, out: Path) -> None:
        calls.append(gguf_file)
        for item in tiny.iterdir():
            (out / item.name).write_bytes(item.read_bytes())

    monkeypatch.setattr(gguf_cache, "_write_folder", convert)
    from spec_backend.runtime import loader

    parses: list[str] = []
    check = loader.check_gguf_architecture

    def counted_check(source: loader.ModelSource) -> None:
        parses.append(source.display)
        check(source)

    monkeypatch.setattr(loader, "check_gguf_architecture", counted_check)
    outs = []
    for _ in range(2):
        llm = LLM(str(gguf))
        assert llm.tokenizer is not None
        outs.append(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=6))[0].outputs[0].token_ids)
    assert calls == ["m.gguf"] and outs[0] == outs[1] and len(outs[0]) == 6
    assert parses == [str(gguf)]  # parsed once, before the conversion; never again once cached


def test_unwritable_cache_falls_back_to_the_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from spec_backend.runtime.loader import loadable
    from spec_backend.runtime.sources import ModelSource

    llama_gguf(tmp_path / "m.gguf")

    def refuse(directory: str, gguf_file: str, out: Path) -> None:
        raise PermissionError(f"read-only: {out}")

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_cache, "_write_folder", refuse)
    source = ModelSource(str(tmp_path), "m.gguf")
    assert loadable(source) == source
    assert "cannot cache" in caplog.text and "loading the GGUF" in caplog.text


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-3])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (
            lambda slot: _truncate(slot / "model.safetensors"),
            r"its model\.safetensors is damaged \(its tensors need 16 bytes of data after the header, "
            r"the file holds 13\)",
        ),
        (lambda slot: (slot / "config.json").write_text("{"), r"its config\.json does not parse \("),
        (
            lambda slot: (slot / gguf_cache.SOURCE_RECORD).unlink(),
            r"it has no readable spec_backend_source\.json saying which GGUF it was converted from",
        ),
    ],
    ids=["truncated-weights", "config-not-json", "no-source-record"],
)
def test_a_damaged_slot_is_rebuilt(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], object],
    reason: str,
) -> None:
    """The loader sees the damage (it does not load the slot as it is), parses the GGUF again and the
    cache rebuilds the slot in place, with a warning naming the folder and what was wrong."""
    from spec_backend.runtime.loader import loadable
    from spec_backend.runtime.sources import ModelSource

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    calls: list[str] = []
    monkeypatch.setattr(gguf_cache, "_write_folder", fake_writer(calls))
    llama_gguf(tmp_path / "m.gguf")
    source = ModelSource(str(tmp_path), "m.gguf")
    slot = Path(loadable(source).directory)
    assert loadable(source).directory == str(slot) and len(calls) == 1  # valid: reused
    damage(slot)
    assert loadable(source).directory == str(slot) and len(calls) == 2
    assert re.search(
        "the GGUF cache folder " + re.escape(str(slot)) + " is not usable: " + reason + ".*; rebuilding it",
        caplog.text,
    )
    assert gguf_cache.slot_problem(slot, tmp_path / "m.gguf") is None and weights_of(slot) == "m.gguf"
    assert sorted(p.name for p in slot.parent.iterdir()) == [slot.name]  # the damaged copy is gone


def test_a_slot_holding_another_ggufs_conversion_is_rebuilt(
    gguf: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A slot folder copied (or restored) from another model: its source record gives it away."""
    calls: list[str] = []
    monkeypatch.setattr(gguf_cache, "_write_folder", fake_writer(calls))
    other = gguf.with_name("other.Q4_1.gguf")
    other.write_bytes(b"GGUF" + bytes(range(64, 160)))
    theirs = Path(gguf_cache.materialize(str(other.parent), other.name))
    ours = gguf_cache.materialized_path(gguf)
    shutil.copytree(theirs, ours)
    assert gguf_cache.materialize(str(gguf.parent), gguf.name) == str(ours) and len(calls) == 2
    assert weights_of(ours) == gguf.name and weights_of(theirs) == other.name
    assert re.search(
        "the GGUF cache folder " + re.escape(str(ours)) + r" is not usable: it holds a conversion of "
        r"another file: " + re.escape(repr(str(other.resolve()))) + r" \(100 bytes, sha256 [0-9a-f]{64}\), "
        r"not of "
        + re.escape(repr(str(gguf.resolve())))
        + r" \(68 bytes, sha256 [0-9a-f]{64}\); rebuilding it",
        caplog.text,
    )


def test_a_damaged_slot_that_cannot_be_replaced_names_the_folder_to_delete(
    gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gguf_cache, "_write_folder", fake_writer(calls))
    slot = Path(gguf_cache.materialize(str(gguf.parent), gguf.name))
    (slot / "config.json").write_text("")
    rename = os.rename

    def refuse_to_move_the_slot(src: Any, dst: Any) -> None:
        if Path(src) == slot:
            raise PermissionError(13, "Permission denied", str(src))
        rename(src, dst)

    monkeypatch.setattr(os, "rename", refuse_to_move_the_slot)
    message = (
        "the GGUF cache folder " + re.escape(repr(str(slot))) + r" is not usable \(its config\.json does "
        r"not parse \(.*\)\) and cannot be replaced \(.*Permission denied.*\); delete that folder and "
        r"run again"
    )
    with pytest.raises(ModelLoadError, match=message):
        gguf_cache.materialize(str(gguf.parent), gguf.name)
    assert sorted(p.name for p in slot.parent.iterdir()) == [slot.name]  # no partial or stale copies left
