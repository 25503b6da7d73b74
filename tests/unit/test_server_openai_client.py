"""The official ``openai`` client as the test (issue 40, item 4): streaming chat, completions, ``n``
samples, logprobs, arguments passed as ``None`` (sent as ``null``), and errors raised as the client's own
exception types, against ``spec-backend serve`` (a tiny model, ngram speculation K=3, as a subprocess).

Every answer is parsed by the client into its typed objects and compared with offline ``generate`` on
the same model and configuration. Structured output is not implemented yet (issue 40, item 2): a
``response_format`` is refused with a 400 that names it, never ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the openai client (test extra)")
pytest.importorskip("fastapi", reason="the server needs the serve extra")

from server_fixtures import SPEC, assert_clean_exit, client, free_port, make_chat_model, start_server  # noqa: E402

from spec_backend.engine import LLM, SamplingParams  # noqa: E402
from spec_backend.engine.params import Logprob  # noqa: E402

MESSAGES: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
CHAT_PROMPT = "<system>be brief\n<user>hi there\n<assistant>"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_chat_model(tmp_path_factory.mktemp("openai_client") / "tiny")


@pytest.fixture(scope="module")
def server(model_dir: str) -> Iterator[str]:
    port = free_port()
    proc = start_server(model_dir, port)
    yield f"http://127.0.0.1:{port}"
    assert_clean_exit(proc)


@pytest.fixture(scope="module")
def offline(model_dir: str) -> LLM:
    return LLM(model_dir, speculative_config=SPEC, max_num_seqs=8, log_stats_interval=None)


def ranked(entry: dict[int, Logprob], top: int) -> list[tuple[str | None, float]]:
    """The ``top`` most likely tokens of an offline logprobs entry, most likely first."""
    items = sorted(entry.values(), key=lambda lp: lp.rank or 0)
    return [(lp.decoded_token, lp.logprob) for lp in items if lp.rank is not None and lp.rank <= top][:top]


def test_streaming_chat_equals_offline_greedy(server: str, offline: LLM) -> None:
    want = offline.generate([CHAT_PROMPT], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    chunks = list(
        client(server).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stream=True
        )
    )
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].model == "tiny"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)


def test_streaming_chat_n_samples_with_logprobs(server: str, offline: LLM) -> None:
    """``n=2`` sampled answers streamed with ``top_logprobs=2``: each index joins to offline sample ``j``
    (seeded ``seed + j``), token for token with its log-probabilities and top tokens."""
    params = SamplingParams(n=2, seed=3, temperature=1.0, max_tokens=10, logprobs=2)
    want = offline.generate([CHAT_PROMPT], params)[0].outputs
    stream = client(server).chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=10,
        temperature=1.0,
        seed=3,
        n=2,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    texts, items = ["", ""], [[], []]  # type: ignore[var-annotated]
    for chunk in stream:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        items[choice.index] += choice.logprobs.content if choice.logprobs is not None else []
    assert texts == [w.text for w in want] and texts[0] != texts[1]
    for got, sample in zip(items, want, strict=True):
        assert sample.logprobs is not None
        assert "".join(i.token for i in got) == sample.text
        assert [i.logprob for i in got] == [
            e[t].logprob for e, t in zip(sample.logprobs, sample.token_ids, strict=True)
        ]
        assert [[(t.token, t.logprob) for t in i.top_logprobs] for i in got] == [
            ranked(e, 2) for e in sample.logprobs
        ]


def test_completions_with_logprobs_and_echo(server: str, offline: LLM) -> None:
    """The completions route through the client: ``logprobs`` with ``echo`` (the prompt's tokens first,
    the first with none) parsed into ``Logprobs``, and the same tokens streamed."""
    prompt, api = "abcabcabc", client(server)
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=1, prompt_logprobs=1)
    want = offline.generate([prompt], params)[0]
    completion = want.outputs[0]
    assert want.prompt_logprobs is not None and completion.logprobs is not None
    got = api.completions.create(
        model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=1, echo=True
    )
    (choice,) = got.choices
    assert choice.text == prompt + completion.text and choice.finish_reason == "length"
    ids = want.prompt_token_ids + completion.token_ids
    entries = [*want.prompt_logprobs, *completion.logprobs]
    tokenizer: Any = offline.tokenizer
    texts = [tokenizer.decode([i]) for i in ids]  # ids the tokenizer lacks decode to ""
    assert choice.logprobs is not None and choice.logprobs.tokens == texts
    assert choice.logprobs.token_logprobs == [
        None if e is None else e[t].logprob for e, t in zip(entries, ids, strict=True)
    ]
    assert choice.logprobs.text_offset == [sum(len(t) for t in texts[:i]) for i in range(len(ids))]
    assert got.usage is not None and (got.usage.prompt_tokens, got.usage.completion_tokens) == (9, 6)
    streamed = list(
        api.completions.create(
            model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=1, stream=True
        )
    )
    tokens = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []]
    assert tokens == choice.logprobs.tokens[len(prompt) :]
    assert "".join(c.choices[0].text for c in streamed) == completion.text


def test_completions_n_samples_over_two_prompts(server: str, offline: LLM) -> None:
    params = SamplingParams(n=2, seed=7, temperature=1.0, max_tokens=8)
    want = [c.text for o in offline.generate(["abc", "xyz"], params) for c in o.outputs]
    got = client(server).completions.create(
        model="tiny", prompt=["abc", "xyz"], max_tokens=8, temperature=1.0, seed=7, n=2
    )
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    assert [c.text for c in got.choices] == want


def test_arguments_passed_as_none_are_absent(server: str, offline: LLM) -> None:
    """The client sends ``null`` for every argument passed as ``None``: each counts as not given."""
    api = client(server)
    nones = dict.fromkeys(
        ("best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "n", "presence_penalty", "seed")
    ) | dict.fromkeys(("stop", "stream", "suffix", "top_p", "user"))
    got = api.completions.create(model="tiny", prompt="hello world", max_tokens=8, temperature=0, **nones)
    want = offline.generate(["hello world"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text
    assert got.choices[0].text == want and got.choices[0].logprobs is None
    chat_nones = dict.fromkeys(
        ("logprobs", "top_logprobs", "max_completion_tokens", "n", "seed", "stop", "response_format")
    ) | dict.fromkeys(("tools", "tool_choice", "user", "presence_penalty", "frequency_penalty"))
    chat = api.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, **chat_nones
    )
    want = offline.generate([CHAT_PROMPT], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text
    assert chat.choices[0].message.content == want and chat.choices[0].logprobs is None


@pytest.mark.parametrize(
    ("arguments", "error", "message", "param"),
    [
        ({"model": "gpt-4"}, openai.NotFoundError, "model 'gpt-4' does not exist", "model"),
        (
            {"max_tokens": -1},
            openai.BadRequestError,
            "max_tokens: Input should be greater than",
            "max_tokens",
        ),
        ({"top_p": 0}, openai.BadRequestError, "top_p: Input should be greater than 0", "top_p"),
        ({"top_logprobs": 2}, openai.BadRequestError, "top_logprobs needs logprobs=true", "top_logprobs"),
        (
            {"messages": [{"role": "user", "content": 5}]},
            openai.BadRequestError,
            "messages.0.content: Input should be a valid string",
            "messages.0.content",
        ),
        (
            {"extra_body": {"tools": [{"type": "function", "function": {"name": "f"}}]}},
            openai.BadRequestError,
            "tools: Extra inputs are not permitted",
            "tools",
        ),
    ],
)
def test_errors_are_the_clients_exception_types(
    server: str, arguments: dict[str, Any], error: type[Exception], message: str, param: str | None
) -> None:
    """An OpenAI error body becomes the client's exception for its status, with its message, code and
    ``param`` (the field at fault) parsed."""
    call: dict[str, Any] = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4} | arguments
    with pytest.raises(error, match=message) as caught:
        client(server).chat.completions.create(**call)
    exc: Any = caught.value
    assert exc.code == str(exc.status_code) and exc.param == param and exc.type


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_format_is_refused_by_name(server: str, stream: bool) -> None:
    """Structured output (issue 40, item 2) is not implemented: a ``response_format`` is a 400 naming the
    field, before any stream starts, and not a plain answer that ignores the schema."""
    with pytest.raises(
        openai.BadRequestError, match="response_format: Extra inputs are not permitted"
    ) as caught:
        client(server).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4, response_format=JSON_SCHEMA, stream=stream
        )
    assert caught.value.status_code == 400 and caught.value.param == "response_format"
