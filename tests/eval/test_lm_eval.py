"""lm-evaluation-harness as the client (issue 40, item 3): its ``local-completions`` and
``local-chat-completions`` models drive ``spec-backend serve``, and its ``hf`` backend scores the same
tiny model in-process; the scores and every per-request answer must agree.

* Log-likelihoods (``echo`` + ``logprobs`` with ``max_tokens=1``, what ``local-completions`` sends)
  agree with the ``hf`` backend's within lm-eval's own tolerance for its HF backend (``atol=1e-2`` on
  each log-likelihood, tests/models/test_huggingface.py), the is-greedy flags are equal, so ``acc`` and
  ``acc_norm`` are equal exactly and the perplexities to ``rel=1e-4``.
* Greedy generation (``generate_until``; chat with lm-eval's ``--apply_chat_template``) is the same
  text as the ``hf`` backend's, and identical with and without speculation (``--speculative-config``
  ngram, K=3; the server's metrics show drafts accepted).

The server without speculation is driven one request at a time (lm-eval's ``requests`` path), the
speculating one with batches of 4 prompts and 2 concurrent requests (its ``aiohttp`` path).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (run make test-eval)")
httpx = pytest.importorskip("httpx")

from eval_tasks import Greedy, generate_task, task_set  # noqa: E402
from server_fixtures import SPEC, TEMPLATE, assert_clean_exit, free_port, start_server  # noqa: E402

from spec_backend.tools.tiny import make_tiny_model  # noqa: E402

#: lm-eval's tolerance on its HF backend's log-likelihoods (tests/models/test_huggingface.py).
LOGLIKELIHOOD_ATOL = 1e-2
LOGLIKELIHOOD_TASKS = ("sb_choice", "sb_greedy", "sb_rolling")
ACCURACIES = {"sb_choice": ("acc,none", "acc_norm,none"), "sb_greedy": ("acc,none",)}
PERPLEXITIES = {
    "sb_greedy": ("perplexity,none",),
    "sb_rolling": ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"),
}
ACCEPTED = "spec_backend_spec_decode_num_accepted_tokens_total"


@dataclass
class Run:
    """One ``simple_evaluate``: metrics per task, and per task and doc the filtered responses."""

    metrics: dict[str, dict[str, Any]]
    answers: dict[str, dict[int, Any]]


@dataclass
class Served:
    completions: Run
    chat: Run
    accepted_tokens: float


def evaluate(model: str, model_args: dict[str, Any], tasks: list[dict[str, Any]], **options: Any) -> Run:
    out = lm_eval.simple_evaluate(
        model=model, model_args=model_args, tasks=tasks, log_samples=True, bootstrap_iters=0, **options
    )
    assert out is not None
    answers = {
        task: {s["doc_id"]: s["filtered_resps"] for s in samples} for task, samples in out["samples"].items()
    }
    return Run({task: dict(m) for task, m in out["results"].items()}, answers)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny random Llama with exactly the character tokenizer's 99 ids (every id spells text) and
    the server tests' chat template."""
    path = make_tiny_model(tmp_path_factory.mktemp("eval") / "tiny", vocab_size=99, with_tokenizer=True)
    Path(path, "chat_template.jinja").write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def greedy(model_dir: str) -> Greedy:
    return Greedy(model_dir)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory, greedy: Greedy) -> list[dict[str, Any]]:
    return task_set(tmp_path_factory.mktemp("tasks"), greedy)


@pytest.fixture(scope="module")
def chat_tasks(tmp_path_factory: pytest.TempPathFactory, greedy: Greedy) -> list[dict[str, Any]]:
    return [generate_task(tmp_path_factory.mktemp("chat_tasks"), greedy)]


@pytest.fixture(scope="module")
def hf(model_dir: str, tasks: list[dict[str, Any]]) -> Run:
    return evaluate("hf", {"pretrained": model_dir, "dtype": "float32", "device": "cpu"}, tasks)


@pytest.fixture(scope="module")
def hf_chat(model_dir: str, chat_tasks: list[dict[str, Any]]) -> Run:
    args = {"pretrained": model_dir, "dtype": "float32", "device": "cpu"}
    return evaluate("hf", args, chat_tasks, apply_chat_template=True)


@pytest.fixture(scope="module")
def backend() -> str:
    """The backend the servers will choose, loaded here first: where it is the cpu backend, its kernels
    are built (or their build checked) in this process, without the servers' start-up deadline."""
    from spec_backend.backends.loader import load_backend

    return type(load_backend()).__name__


def serve_and_evaluate(
    model_dir: str,
    tasks: list[dict[str, Any]],
    chat_tasks: list[dict[str, Any]],
    spec: dict[str, Any] | None,
    client: dict[str, Any],
) -> Iterator[Served]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(model_dir, port, spec=spec)
    try:
        common = {"model": "tiny", "max_retries": 1, **client}
        completions = evaluate(
            "local-completions",
            common
            | {
                "base_url": f"{base}/v1/completions",
                "tokenizer_backend": "huggingface",
                "tokenizer": model_dir,
            },
            tasks,
        )
        chat_args = common | {"base_url": f"{base}/v1/chat/completions", "batch_size": 1}
        chat = evaluate("local-chat-completions", chat_args, chat_tasks, apply_chat_template=True)
        metrics = httpx.get(f"{base}/metrics").text
    finally:
        assert_clean_exit(proc)
    accepted = [float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(ACCEPTED)]
    yield Served(completions, chat, sum(accepted))


@pytest.fixture(scope="module")
def plain(
    backend: str, model_dir: str, tasks: list[dict[str, Any]], chat_tasks: list[dict[str, Any]]
) -> Iterator[Served]:
    yield from serve_and_evaluate(model_dir, tasks, chat_tasks, None, {"batch_size": 1, "num_concurrent": 1})


@pytest.fixture(scope="module")
def ngram(
    backend: str, model_dir: str, tasks: list[dict[str, Any]], chat_tasks: list[dict[str, Any]]
) -> Iterator[Served]:
    yield from serve_and_evaluate(model_dir, tasks, chat_tasks, SPEC, {"batch_size": 4, "num_concurrent": 2})


@pytest.fixture(params=["plain", "ngram"])
def served(request: pytest.FixtureRequest) -> Served:
    result: Served = request.getfixturevalue(request.param)
    return result


def loglikelihoods(answer: Any) -> list[float]:
    """The log-likelihood of each request of one doc (``[ll, is_greedy]`` pairs, or a rolling ``ll``)."""
    return [float(a[0]) if isinstance(a, list | tuple) else float(a) for a in answer]


def greedy_flags(answer: Any) -> list[bool]:
    return [bool(a[1]) for a in answer if isinstance(a, list | tuple)]


@pytest.mark.parametrize("task", LOGLIKELIHOOD_TASKS)
def test_loglikelihoods_equal_the_hf_backend(served: Served, hf: Run, task: str) -> None:
    got, want = served.completions.answers[task], hf.answers[task]
    assert sorted(got) == sorted(want) and len(want) >= 3
    for doc in want:
        assert loglikelihoods(got[doc]) == pytest.approx(loglikelihoods(want[doc]), abs=LOGLIKELIHOOD_ATOL)
        assert greedy_flags(got[doc]) == greedy_flags(want[doc])
    for metric in ACCURACIES.get(task, ()):
        assert served.completions.metrics[task][metric] == hf.metrics[task][metric], metric
    for metric in PERPLEXITIES.get(task, ()):
        assert served.completions.metrics[task][metric] == pytest.approx(hf.metrics[task][metric], rel=1e-4)


def test_the_task_set_is_not_trivial(hf: Run) -> None:
    """The negative control: ``sb_greedy`` and ``sb_generate`` target the greedy continuation on every
    other doc, so the is-greedy flag and ``exact_match`` are seen both ways, and the choices'
    log-likelihoods differ."""
    assert hf.metrics["sb_greedy"]["acc,none"] == 0.5 and hf.metrics["sb_generate"]["exact_match,none"] == 0.5
    assert [greedy_flags(hf.answers["sb_greedy"][d]) for d in range(6)] == [[True], [False]] * 3
    assert len({round(x, 3) for a in hf.answers["sb_choice"].values() for x in loglikelihoods(a)}) > 8


def test_greedy_generation_equals_the_hf_backend(served: Served, hf: Run) -> None:
    got, want = served.completions.answers["sb_generate"], hf.answers["sb_generate"]
    assert got == want and len({a[0] for a in want.values()}) >= 4  # not one answer for every prompt
    assert served.completions.metrics["sb_generate"] == hf.metrics["sb_generate"]


def test_chat_generation_equals_the_hf_backend_with_its_chat_template(served: Served, hf_chat: Run) -> None:
    got, want = served.chat.answers["sb_generate"], hf_chat.answers["sb_generate"]
    assert got == want and all(a[0] for a in want.values())


def test_speculation_changes_no_score_or_greedy_answer(plain: Served, ngram: Served) -> None:
    assert plain.accepted_tokens == 0 and ngram.accepted_tokens > 0  # the ngram server did speculate
    for task in ("sb_generate",):
        assert ngram.completions.answers[task] == plain.completions.answers[task]
        assert ngram.chat.answers[task] == plain.chat.answers[task]
    for task in LOGLIKELIHOOD_TASKS:
        for doc, answer in plain.completions.answers[task].items():
            assert loglikelihoods(ngram.completions.answers[task][doc]) == pytest.approx(
                loglikelihoods(answer), abs=LOGLIKELIHOOD_ATOL
            )
        for metric in ACCURACIES.get(task, ()):
            assert ngram.completions.metrics[task][metric] == plain.completions.metrics[task][metric]
