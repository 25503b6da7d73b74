"""The OpenAI protocol as clients send it: ``null`` for absent fields, strict types, lone surrogates,
undecodable bodies, and ``n`` samples per prompt (seeded as offline ``generate`` seeds them), streamed
or not. A tiny model with ngram speculation (K=3), served as a subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("openai", reason="the server tests need the openai client (test extra)")
pytest.importorskip("fastapi", reason="the server needs the serve extra")
pytest.importorskip("httpx")

from server_fixtures import (
    SPEC,
    client,
    make_chat_model,
    post,
    served,
    sse_payloads,
)

from spec_backend.engine import LLM, SamplingParams

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi there"}]
CHAT_PROMPT = "<user>hi there\n<assistant>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_chat_model(tmp_path_factory.mktemp("protocol") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir: str) -> Iterator[str]:
    yield from served(model_dir)


@pytest.fixture(scope="module")
def offline(model_dir: str) -> LLM:
    return LLM(model_dir, speculative_config=SPEC, max_num_seqs=8)


def texts(offline: LLM, prompts: list[str], **params: Any) -> list[list[str]]:
    """Per prompt, the texts of its samples as offline ``generate`` gives them."""
    return [[c.text for c in o.outputs] for o in offline.generate(prompts, SamplingParams(**params))]


def test_null_fields_count_as_absent(server: str, offline: LLM) -> None:
    """What the official client sends for arguments passed as ``None``: before, ``"logprobs": null``
    was a 400 ("Extra inputs are not permitted")."""
    nulls = dict.fromkeys(("logprobs", "stop", "seed", "n", "echo", "top_p", "user", "logit_bias", "stream"))
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, **nulls}
    response = post(server, COMPLETIONS, body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["text"] == texts(offline, ["hello world"], temperature=0, max_tokens=8)[0][0]
    assert choice["logprobs"] is None
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi there", "name": None}],
        "max_tokens": 8,
        "temperature": 0,
        **dict.fromkeys(("logprobs", "top_logprobs", "max_completion_tokens", "stop", "n", "seed")),
    }
    response = post(server, CHAT, chat)
    assert response.status_code == 200, response.text
    expected = texts(offline, [CHAT_PROMPT], temperature=0, max_tokens=8)[0][0]
    assert response.json()["choices"][0]["message"]["content"] == expected
    got = client(server).completions.create(
        model="tiny", prompt="hello world", max_tokens=8, temperature=0, logprobs=None, stop=None, seed=None
    )
    assert got.choices[0].text == choice["text"]


@pytest.mark.parametrize(
    ("route", "change", "message"),
    [
        (COMPLETIONS, {"max_tokens": "10"}, "max_tokens: Input should be a valid integer"),
        (COMPLETIONS, {"stream": "yes"}, "stream: Input should be a valid boolean"),
        (COMPLETIONS, {"prompt": [True, 2]}, "prompt.list[int].0: Input should be a valid integer"),
        (COMPLETIONS, {"temperature": "0"}, "temperature: Input should be a valid number"),
        (COMPLETIONS, {"n": 2.0}, "n: Input should be a valid integer"),
        (COMPLETIONS, {"logprobs": True}, "logprobs: Input should be a valid integer"),
        (COMPLETIONS, {"seed": "1"}, "seed: Input should be a valid integer"),
        (COMPLETIONS, {"model": None}, "model: Input should be a valid string"),
        (CHAT, {"logprobs": 1}, "logprobs: Input should be a valid boolean"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": 5}]},
            "messages.0.content: Input should be a valid string",
        ),
        (CHAT, {"top_logprobs": 2}, "top_logprobs needs logprobs=true"),
    ],
)
def test_wrong_types_are_refused_not_coerced(
    server: str, route: str, change: dict[str, Any], message: str
) -> None:
    """Before: ``"10"`` became 10, ``"yes"`` became true and ``[true, 2]`` the ids [1, 2]."""
    base: dict[str, Any] = {"model": "tiny", "max_tokens": 2}
    base |= {"prompt": "hello"} if route == COMPLETIONS else {"messages": MESSAGES}
    response = post(server, route, base | change)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == 400, error


@pytest.mark.parametrize(
    ("route", "raw", "where"),
    [
        (
            COMPLETIONS,
            b'{"model": "tiny", "prompt": "\\ud800"}',
            "prompt holds a lone UTF-16 surrogate U+D800",
        ),
        (COMPLETIONS, b'{"model": "tiny", "prompt": ["ok", "a\\udfff"]}', "prompt[1] holds a lone UTF-16"),
        (
            COMPLETIONS,
            b'{"model": "tiny", "prompt": "x", "stop": ["\\ud83d"]}',
            "stop[0] holds a lone UTF-16",
        ),
        (
            CHAT,
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
            "messages[0].content holds a lone UTF-16 surrogate U+D800 at character 3",
        ),
    ],
)
def test_lone_surrogates_are_a_400(server: str, route: str, raw: bytes, where: str) -> None:
    """Before: a plain-text 500 (the tokenizer could not encode the text)."""
    response = post(server, route, raw)
    assert response.status_code == 400, response.text
    assert where in response.json()["error"]["message"]


def test_a_surrogate_pair_is_text(server: str) -> None:
    """The negative control: an escaped pair (an emoji) is valid Unicode."""
    response = post(
        server, COMPLETIONS, b'{"model": "tiny", "prompt": "smile \\ud83d\\ude00", "max_tokens": 2}'
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("method", "route", "raw", "status", "message"),
    [
        ("POST", COMPLETIONS, b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, "the body is not UTF-8 JSON"),
        ("POST", COMPLETIONS, b"{bad json", 400, "JSON decode error"),
        ("POST", "/v1/nothing", b"{}", 404, "Not Found"),
        ("GET", COMPLETIONS, b"", 405, "Method Not Allowed"),
    ],
)
def test_undecodable_bodies_and_unknown_routes_use_the_error_shape(
    server: str, method: str, route: str, raw: bytes, status: int, message: str
) -> None:
    """Before: ``{"detail": ...}`` (FastAPI's own shape) for these."""
    import httpx

    headers = {"content-type": "application/json"}
    response = httpx.request(method, f"{server}{route}", content=raw, headers=headers, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status and "type" in error


def test_n_samples_equal_offline_n(server: str, offline: LLM) -> None:
    """``n=2`` over two prompts: four choices, prompt-major, each equal to offline ``generate`` with
    ``SamplingParams(n=2, seed=7)`` (sample ``j`` seeded ``seed + j``)."""
    prompts = ["abc", "xyz"]
    expected = texts(offline, prompts, n=2, seed=7, temperature=1.0, max_tokens=12)
    assert expected[0][0] != expected[0][1]  # the samples differ: n is not one answer repeated
    body = {"model": "tiny", "prompt": prompts, "max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 2}
    got = post(server, COMPLETIONS, body).json()
    assert [c["index"] for c in got["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in got["choices"]] == [t for sample in expected for t in sample]
    usage = {"prompt_tokens": 6, "completion_tokens": 48, "total_tokens": 54}
    assert got["usage"] == {**usage, "prompt_tokens_details": {"cached_tokens": 0}}  # < one block
    api = client(server)
    one = api.completions.create(model="tiny", prompt="abc", max_tokens=12, temperature=1.0, seed=7, n=2)
    assert [c.text for c in one.choices] == expected[0]


def test_n_samples_stream_with_their_index(server: str, offline: LLM) -> None:
    expected = texts(offline, ["abc", "xyz"], n=2, seed=7, temperature=1.0, max_tokens=12)
    body = {"model": "tiny", "prompt": ["abc", "xyz"], "max_tokens": 12, "temperature": 1.0, "seed": 7}
    events = sse_payloads(server, COMPLETIONS, body | {"n": 2, "stream": True})
    joined = ["", "", "", ""]
    finished = [None] * 4
    for event in events:
        (choice,) = event["choices"]
        joined[choice["index"]] += choice["text"]
        finished[choice["index"]] = choice["finish_reason"]
    assert joined == [t for sample in expected for t in sample]
    assert finished == ["length"] * 4


def test_chat_n_samples_streamed_and_not(server: str, offline: LLM) -> None:
    expected = texts(offline, [CHAT_PROMPT], n=3, seed=11, temperature=1.0, max_tokens=10)[0]
    api = client(server)
    whole = api.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=10, temperature=1.0, seed=11, n=3
    )
    assert [c.message.content for c in whole.choices] == expected
    chunks = list(
        api.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=10, temperature=1.0, seed=11, n=3, stream=True
        )
    )
    joined = ["", "", ""]
    roles = set()
    for chunk in chunks:
        (choice,) = chunk.choices
        joined[choice.index] += choice.delta.content or ""
        if choice.delta.role:
            roles.add(choice.index)
    assert joined == expected and roles == {0, 1, 2}
