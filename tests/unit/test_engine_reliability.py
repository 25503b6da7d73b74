"""The engine under concurrent and interrupted use, and every input checked at the door.

Before these fixes, two threads calling ``generate`` on one ``LLM`` failed every request of both calls
and could leave stale cache slots that made later calls return wrong tokens without an error.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from spec_backend.backends.base import BackendError
from spec_backend.engine import LLM, ModelLoadError, SamplingParams
from spec_backend.tools.tiny import make_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [40, 41, 42], [11, 12, 11, 12, 11], [90, 3, 90, 3, 90, 3]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", vocab_size=128)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llm(model_dir: str) -> LLM:
    return LLM(model_dir, speculative_config=NGRAM, max_num_seqs=3, max_model_len=64)


def _call(n: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Call n's prompts and params: greedy or explicitly seeded, so its outputs do not depend on order."""
    prompts = [PROMPTS[n % 4], PROMPTS[(n + 1) % 4]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6 + n % 3),
        SamplingParams(temperature=0.9, seed=1000 + n, max_tokens=7),
    ]
    return prompts, params


def _tokens(llm: LLM, n: int) -> list[tuple[list[int], str | None]]:
    prompts, params = _call(n)
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in llm.generate(prompts, params)]


def _idle(llm: LLM) -> bool:
    engine = llm.engine
    return engine.runner.cache.num_slots == 0 and not engine.has_unfinished() and engine.slots.consistent()


def test_concurrent_generate_equals_sequential(llm: LLM) -> None:
    expected = {n: _tokens(llm, n) for n in range(40)}
    assert all(reason in ("length", "stop") for out in expected.values() for _, reason in out)
    got: dict[int, list[tuple[list[int], str | None]]] = {}
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for n in range(first, 40, 4):  # 4 threads x 10 calls
                got[n] = _tokens(llm, n)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows: calls interleave
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert got == expected
    assert _idle(llm)


class _Interrupting:
    """Wraps the engine's proposer and raises ``exc`` from its ``after``-th ``propose``."""

    def __init__(self, inner: Any, exc: BaseException, after: int) -> None:
        self.inner, self.exc, self.calls, self.after = inner, exc, 0, after

    def propose(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.after:
            raise self.exc
        return self.inner.propose(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)], ids=["KeyboardInterrupt", "SystemExit"])
def test_exception_escaping_mid_step_leaves_a_clean_engine(llm: LLM, exc: BaseException) -> None:
    expected = _tokens(llm, 1)
    proposer = llm.engine.drafter.proposer  # the host proposer behind the HostDrafter adapter
    llm.engine.drafter.proposer = _Interrupting(proposer, exc, after=2)
    try:
        with pytest.raises(type(exc)):
            _tokens(llm, 1)
    finally:
        llm.engine.drafter.proposer = proposer
    assert _idle(llm)
    assert _tokens(llm, 1) == expected


def test_stale_slot_is_detected_and_cleared(llm: LLM, caplog: pytest.LogCaptureFixture) -> None:
    expected = _tokens(llm, 2)
    llm.engine.slots.add()  # what an interrupted step used to leave behind
    with caplog.at_level(logging.ERROR, logger="spec_backend.engine"):
        assert _tokens(llm, 2) == expected
    assert "engine was not idle before new work (engine state is inconsistent: 1 cache slot(s)" in caplog.text
    assert _idle(llm)


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        (["hi", 5], r"prompt 1 must be a string, a list of token ids .*; got int: 5"),
        (None, r"generate\(\) needs prompts: .*got None"),
        (
            torch.tensor([1, 2]),
            r"prompt 0 must be .*got Tensor: .*\(pass token ids as a list: tensor.tolist\(\)\)",
        ),
        ([torch.tensor([1, 2])], r"prompt 0 must be .*got Tensor"),
        (b"hi", r"prompt 0 must be .*got bytes: b'hi'"),
        ([[1, 2], b"\x01"], r"prompt 1 must be .*got bytes"),
        ([{"text": "hi"}], r"prompt 0 is a dict with keys \['text'\]; a dict prompt has exactly one of"),
        (
            [{"prompt": "hi", "prompt_token_ids": [1]}],
            r"keys \['prompt', 'prompt_token_ids'\]; a dict prompt has exactly one of",
        ),
        ([{"prompt": "hi", "cache_salt": ""}], r"prompt 0: 'cache_salt' must be a non-empty string, got str"),
        (
            [{"prompt": "hi", "cache_salt": 7}],
            r"prompt 0: 'cache_salt' must be a non-empty string, got int: 7",
        ),
        ([{"prompt_token_ids": "ab"}], r"prompt 0: 'prompt_token_ids' must be a list of ints, got str"),
        ([1.5, 2.5], r"prompt 0 must be .*got float: 1.5"),
        ([[1, True]], r"prompt 0 must be .*got list"),
    ],
)
def test_bad_prompts_are_named_errors(llm: LLM, prompts: Any, match: str) -> None:
    steps = llm.engine.num_steps
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, SamplingParams(max_tokens=2))
    assert llm.engine.num_steps == steps and _idle(llm)


def test_dict_prompts_are_accepted_as_in_vllm(llm: LLM) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    plain = llm.generate([PROMPTS[0], PROMPTS[1]], greedy)
    dicts = llm.generate([{"prompt_token_ids": PROMPTS[0]}, {"prompt_token_ids": tuple(PROMPTS[1])}], greedy)
    assert [o.outputs[0].token_ids for o in dicts] == [o.outputs[0].token_ids for o in plain]
    single = llm.generate({"prompt_token_ids": PROMPTS[0]}, greedy)
    assert single[0].outputs[0].token_ids == plain[0].outputs[0].token_ids


def test_stop_strings_need_a_tokenizer(llm: LLM) -> None:
    with pytest.raises(
        ValueError, match=r"sampling_params\[0\] has stop strings \['x'\] but model .* no tokenizer"
    ):
        llm.generate([PROMPTS[0]], SamplingParams(stop="x"))


@pytest.mark.parametrize("seed", [-1, 2**63, -(2**70), 1.5])
def test_unusable_seeds_are_refused_when_params_are_built(seed: Any) -> None:
    with pytest.raises(ValueError, match=r"seed must be None \(unseeded\) or an int in \[0, 2\*\*63 - 1\]"):
        SamplingParams(seed=seed)


def test_every_accepted_seed_is_reproducible(llm: LLM) -> None:
    for seed in (0, 2**32 + 7, 2**63 - 1):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=8)
        first = llm.generate([PROMPTS[1]], params)[0].outputs[0]
        again = llm.generate([PROMPTS[1]], params)[0].outputs[0]
        assert first.finish_reason in ("length", "stop") and first.token_ids == again.token_ids


@pytest.mark.parametrize("backend", ["cuda", "ascend"])
def test_unavailable_backend_fails_before_loading_weights(backend: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"  # a weights load would fail with ModelLoadError instead
    with pytest.raises(BackendError, match=rf"backend '{backend}' cannot run on this machine: .+"):
        LLM(str(missing), backend=backend)


def test_env_backend_without_hardware_fails_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEC_BACKEND", "cuda")
    with pytest.raises(BackendError, match=r"backend 'cuda' cannot run on this machine"):
        LLM(str(tmp_path / "no-such-model"))


def test_prompt_lookup_max_above_the_proposer_limit_is_a_config_error(tmp_path: Path) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 256}
    with pytest.raises(ValueError, match=r"prompt_lookup_max=256 is above the ngram proposer's limit of 255"):
        LLM(str(tmp_path / "no-such-model"), speculative_config=spec)


def test_pickled_checkpoints_are_refused(model_dir: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    (tmp_path / "config.json").write_text(Path(model_dir, "config.json").read_text())
    torch.save(load_file(str(Path(model_dir, "model.safetensors"))), tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as info:
        LLM(str(tmp_path))
    message = str(info.value)
    assert "['pytorch_model.bin']" in message and "save_pretrained" in message
    assert "weights_only=False" not in message


def test_corrupt_safetensors_is_a_model_load_error(model_dir: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(Path(model_dir, "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match=r"model.safetensors is not a readable safetensors file"):
        LLM(str(tmp_path))


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--backend", "nosuch", "--prompt", "hi"], r"unknown backend 'nosuch'; installed backends: "),
        (["--prompts-file", "/no/such/file"], r"cannot read --prompts-file '/no/such/file': "),
        (["--speculative-config", "{bad", "--prompt", "hi"], r"--speculative-config is not valid JSON"),
        (["--additional-config", "[1]", "--prompt", "hi"], r"--additional-config must be a JSON object"),
        (["--model", "MODEL/missing", "--prompt", "hi"], r"unknown model '.*missing'"),
        (
            ["--model", "MODEL/corrupt", "--prompt", "hi"],
            r"model.safetensors is not a readable safetensors file",
        ),
        (["--model", "MODEL/tiny", "--prompt", "hi"], r"prompt 0 is text but model .* has no tokenizer"),
    ],
)
def test_cli_errors_are_one_line_with_status_2(
    args: list[str], match: str, model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from spec_backend import cli

    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "config.json").write_text(Path(model_dir, "config.json").read_text())
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"garbage")
    paths = {"MODEL/tiny": model_dir, "MODEL/": f"{tmp_path}/"}
    argv = ["generate", "--no-progress", *args]
    for key, value in paths.items():
        argv = [a.replace(key, value) if a.startswith(key) else a for a in argv]
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    err = [line for line in lines if line.strip() and "Loading weights" not in line]  # transformers' bar
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0]
    assert re.search(match, err[0]), err[0]
