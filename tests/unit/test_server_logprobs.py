"""Logprobs over HTTP in OpenAI's shapes, equal to offline ``generate``'s: completions ``logprobs``
(with ``echo``, and ``max_tokens=0`` for the prompt alone, as evaluation harnesses ask) and chat's
``logprobs`` + ``top_logprobs``, streamed and not.

The server speculates with the target itself as draft model (K=3: every greedy draft is accepted, so
steps emit several tokens); its values equal offline ``generate`` with the same configuration exactly,
and offline ``generate`` without speculation to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openai", reason="the server tests need the openai client (test extra)")
pytest.importorskip("fastapi", reason="the server needs the serve extra")
httpx = pytest.importorskip("httpx")

from server_fixtures import (  # noqa: E402
    assert_clean_exit,
    client,
    free_port,
    make_chat_model,
    post,
    sse_payloads,
    start_server,
)

from spec_backend.engine import LLM, SamplingParams  # noqa: E402
from spec_backend.engine.params import Logprob, RequestOutput  # noqa: E402

PROMPT = "abcabcabc"
CHAT_PROMPT = "<user>hi there\n<assistant>"
MESSAGES = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_chat_model(tmp_path_factory.mktemp("logprobs") / "tiny")


def spec(model_dir: str) -> dict[str, Any]:
    return {
        "adaptive_draft_length": False,
        "method": "draft_model",
        "model": model_dir,
        "num_speculative_tokens": 3,
    }


@pytest.fixture(scope="module")
def server(model_dir: str) -> Iterator[str]:
    port = free_port()
    # logprobs are compared bit for bit with offline runs: no prefix cache on either side, whose hits
    # compute a prompt's last rows in a smaller batch (equal up to rounding: test_prefix_caching.py)
    proc = start_server(model_dir, port, ["--no-enable-prefix-caching"], spec=spec(model_dir))
    yield f"http://127.0.0.1:{port}"
    assert_clean_exit(proc)


@pytest.fixture(scope="module")
def offline(model_dir: str) -> LLM:
    return LLM(
        model_dir,
        speculative_config=spec(model_dir),
        max_num_seqs=8,
        log_stats_interval=None,
        enable_prefix_caching=False,
    )


@pytest.fixture(scope="module")
def plain(model_dir: str) -> LLM:
    return LLM(model_dir, max_num_seqs=8, log_stats_interval=None, enable_prefix_caching=False)


def generate(llm: LLM, prompt: str, **params: Any) -> RequestOutput:
    return llm.generate([prompt], SamplingParams(temperature=0, **params))[0]


def ranked(entry: dict[int, Logprob]) -> list[tuple[int, Logprob]]:
    return sorted(entry.items(), key=lambda item: item[1].rank or 0)


def check_block(got: dict[str, Any], ids: list[int], entries: list[Any], tokenizer: Any) -> None:
    """``got`` is the completions ``logprobs`` object of these offline ids and entries: token texts,
    chosen logprobs, the top tokens (most likely first) with the chosen one, and offsets."""
    assert got["tokens"] == [tokenizer.decode([i]) for i in ids]
    assert got["token_logprobs"] == [
        None if e is None else e[i].logprob for e, i in zip(entries, ids, strict=True)
    ]
    tops = [None if e is None else [(lp.decoded_token, lp.logprob) for _, lp in ranked(e)] for e in entries]
    assert [None if t is None else list(t.items()) for t in got["top_logprobs"]] == [
        None if t is None else list(dict(t).items()) for t in tops
    ]
    assert got["text_offset"] == [sum(len(t) for t in got["tokens"][:i]) for i in range(len(ids))]


def test_completion_logprobs_equal_offline(server: str, offline: LLM, plain: LLM) -> None:
    got = post(
        server,
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 3},
    )
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    want = generate(offline, PROMPT, max_tokens=12, logprobs=3).outputs[0]
    assert want.logprobs is not None and choice["text"] == want.text
    check_block(choice["logprobs"], want.token_ids, list(want.logprobs), offline.tokenizer)
    bare = generate(plain, PROMPT, max_tokens=12, logprobs=3).outputs[0]  # no speculation
    assert bare.token_ids == want.token_ids and bare.logprobs is not None
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(
        [e[t].logprob for e, t in zip(bare.logprobs, bare.token_ids, strict=True)], abs=1e-4
    )
    metrics = httpx.get(f"{server}/metrics").text
    accepted = [
        line
        for line in metrics.splitlines()
        if line.startswith("spec_backend_spec_decode_num_accepted_tokens_total")
    ]
    assert accepted and float(accepted[0].split()[-1]) > 0, accepted  # the server did speculate


def test_echo_with_max_tokens_0_gives_the_prompts_logprobs(server: str, offline: LLM, plain: LLM) -> None:
    """An evaluation harness's log-likelihood request: the prompt's tokens and logprobs, no completion;
    the first token has none."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    got = post(server, "/v1/completions", body).json()
    (choice,) = got["choices"]
    want = generate(offline, PROMPT, max_tokens=1, prompt_logprobs=1)
    assert want.prompt_logprobs is not None
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == list(PROMPT)
    check_block(choice["logprobs"], want.prompt_token_ids, list(want.prompt_logprobs), offline.tokenizer)
    assert choice["logprobs"]["token_logprobs"][0] is None and choice["logprobs"]["top_logprobs"][0] is None
    usage = {"prompt_tokens": 9, "completion_tokens": 0, "total_tokens": 9}
    assert got["usage"] == {**usage, "prompt_tokens_details": {"cached_tokens": 0}}  # prompt logprobs
    bare = generate(plain, PROMPT, max_tokens=1, prompt_logprobs=1)
    assert bare.prompt_logprobs is not None
    entries = zip(bare.prompt_logprobs[1:], bare.prompt_token_ids[1:], strict=True)
    expected = [e[t].logprob for e, t in entries if e is not None]
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    api = client(server)  # the official client parses it
    parsed = api.completions.create(model="tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    assert parsed.choices[0].logprobs.token_logprobs == choice["logprobs"]["token_logprobs"]


def test_echo_with_a_completion_and_token_ids(server: str, offline: LLM) -> None:
    ids = [13, 14, 15, 13, 14, 15]  # "bcdbcd" in the character tokenizer
    body = {"model": "tiny", "prompt": ids, "max_tokens": 5, "echo": True, "logprobs": 2, "temperature": 0}
    choice = post(server, "/v1/completions", body).json()["choices"][0]
    want = offline.generate(
        [ids], SamplingParams(temperature=0, max_tokens=5, logprobs=2, prompt_logprobs=2)
    )[0]
    assert want.prompt_logprobs is not None and want.outputs[0].logprobs is not None
    assert choice["text"] == "bcdbcd" + want.outputs[0].text
    all_ids = ids + want.outputs[0].token_ids
    entries = [*want.prompt_logprobs, *want.outputs[0].logprobs]
    check_block(choice["logprobs"], all_ids, entries, offline.tokenizer)


def test_chat_logprobs_equal_offline(server: str, offline: LLM) -> None:
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    choice = post(server, "/v1/chat/completions", body).json()["choices"][0]
    want = generate(offline, CHAT_PROMPT, max_tokens=8, logprobs=2).outputs[0]
    assert want.logprobs is not None
    content = choice["logprobs"]["content"]
    assert [c["logprob"] for c in content] == [
        e[t].logprob for e, t in zip(want.logprobs, want.token_ids, strict=True)
    ]
    for item, entry, token in zip(content, want.logprobs, want.token_ids, strict=True):
        assert item["token"] == entry[token].decoded_token and item["bytes"] == list(item["token"].encode())
        top = [
            (lp.decoded_token, lp.logprob) for _, lp in ranked(entry) if lp.rank is not None and lp.rank <= 2
        ]
        assert [(t["token"], t["logprob"]) for t in item["top_logprobs"]] == top and len(top) == 2
    parsed = client(server).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    assert [c.logprob for c in parsed.choices[0].logprobs.content] == [c["logprob"] for c in content]
    plain_body = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
    assert post(server, "/v1/chat/completions", plain_body).json()["choices"][0]["logprobs"] is None


def test_streamed_logprobs_join_to_the_whole(server: str) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 2}
    whole = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for event in sse_payloads(server, "/v1/completions", body | {"stream": True}):
        block = event["choices"][0]["logprobs"]
        for key in joined:
            joined[key] += block[key]
    assert joined == whole
    chat = {
        "model": "tiny",
        "messages": MESSAGES,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
    }
    whole_chat = post(server, "/v1/chat/completions", chat).json()["choices"][0]["logprobs"]["content"]
    streamed = [
        item
        for event in sse_payloads(server, "/v1/chat/completions", chat | {"stream": True})
        if event["choices"][0]["logprobs"] is not None
        for item in event["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == whole_chat
