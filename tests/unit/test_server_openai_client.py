"""The official ``openai`` client as the test (issue 40, item 4): streaming chat, completions, ``n``
samples, logprobs, arguments passed as ``None`` (sent as ``null``), and errors raised as the client's own
exception types, against ``spec-backend serve`` (a tiny model, ngram speculation K=3, as a subprocess).

Every answer is parsed by the client into its typed objects and compared with offline ``generate`` on
the same model and configuration; so are structured outputs (``response_format``, vLLM's ``guided_*``
and ``structured_outputs`` fields), and their bad requests are 400s naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the openai client (test extra)")
pytest.importorskip("fastapi", reason="the server needs the serve extra")

from server_fixtures import SPEC, client, make_chat_model, served  # noqa: E402

from spec_backend.engine import LLM, SamplingParams, StructuredOutputsParams  # noqa: E402
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
    yield from served(model_dir)


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


def test_streamed_usage_is_the_whole_responses_usage(server: str) -> None:
    """``stream_options={"include_usage": True}``: one last chunk with no choices carries the usage the
    same request gets without streaming (``n=2``: the prompt once, both samples' tokens), cached prompt
    tokens included; chat and completions. Without it no chunk carries usage."""
    api = client(server)
    messages = [{"role": "user", "content": "count the usage of this stream"}]  # 48 tokens, this test's own
    call: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": 9, "seed": 5, "n": 2}
    whole = api.chat.completions.create(**call)
    chunks = list(api.chat.completions.create(**call, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    got, want = chunks[-1].usage, whole.usage
    assert got is not None and want is not None
    assert (
        (got.prompt_tokens, got.completion_tokens) == (want.prompt_tokens, 18) == (48, want.completion_tokens)
    )
    # the first request stored the prompt's three whole blocks; the streamed one took all but the last token
    cached = [u.prompt_tokens_details.cached_tokens for u in (want, got) if u.prompt_tokens_details]
    assert cached == [0, 47]
    assert all(c.usage is None for c in api.chat.completions.create(**call, stream=True))
    prompt = "usage stream " * 4  # 52 characters: three whole 16-token blocks on the second call
    kwargs: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 5, "temperature": 0}
    first = api.completions.create(**kwargs)
    streamed = list(api.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    usage = streamed[-1].usage
    assert streamed[-1].choices == [] and usage is not None and first.usage is not None
    assert usage.prompt_tokens == first.usage.prompt_tokens and usage.completion_tokens == 5
    details = usage.prompt_tokens_details
    assert details is not None and details.cached_tokens == 48


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
        (
            {"stream_options": {"include_usage": True}},
            openai.BadRequestError,
            "stream_options is only allowed with stream=true",
            None,
        ),
        (
            {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
            openai.BadRequestError,
            "continuous_usage_stats: Extra inputs are not permitted",
            "stream_options.continuous_usage_stats",
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


def _streamed_text(chunks: list[Any]) -> tuple[str, str | None]:
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, (reasons[-1] if reasons else None)


def test_streaming_chat_with_a_json_schema_equals_offline(server: str, offline: LLM) -> None:
    """``response_format`` of type ``json_schema`` (issue 40, items 2 and 4): the streamed answer is the
    offline structured output, token for token, under ngram speculation. OpenAI's format cannot turn off
    JSON's free whitespace, and the tiny random model spends its budget on newlines after the opening
    brace (what ``disable_any_whitespace`` is for)."""
    structured = StructuredOutputsParams(json=SCHEMA)
    params = SamplingParams(temperature=0, max_tokens=48, structured_outputs=structured)
    want = offline.generate([CHAT_PROMPT], params)[0].outputs[0]
    chunks = list(
        client(server).chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=48,
            temperature=0,
            response_format=JSON_SCHEMA,
            stream=True,
        )
    )
    text, reason = _streamed_text(chunks)
    assert (text, reason) == (want.text, want.finish_reason)
    assert reason == "length" and text.startswith("{") and text[1:].isspace()


def test_vllm_guided_fields_through_the_client(server: str, offline: LLM) -> None:
    """vLLM's ``guided_choice`` and ``structured_outputs`` request fields (``extra_body``) constrain the
    answer as offline ``structured_outputs`` does (``json_object``: the tiny model opens an object and
    writes a key until ``max_tokens``)."""
    api = client(server)
    cases = [
        ({"guided_choice": ["red", "green", "blue"]}, {"choice": ["red", "green", "blue"]}),
        ({"guided_regex": "[0-9]{3}"}, {"regex": "[0-9]{3}"}),
        ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, None),
    ]
    wants = []
    for body, offline_spec in cases:
        spec = offline_spec or body["structured_outputs"]
        params = SamplingParams(temperature=0, max_tokens=24, structured_outputs=spec)
        want = offline.generate(["hello world"], params)[0].outputs[0]
        got = api.completions.create(
            model="tiny", prompt="hello world", max_tokens=24, temperature=0, extra_body=body
        )
        assert (got.choices[0].text, got.choices[0].finish_reason) == (want.text, want.finish_reason), body
        wants.append(want)
    assert [w.finish_reason for w in wants] == ["stop", "stop", "length"]
    assert wants[0].text in ("red", "green", "blue") and re.fullmatch("[0-9]{3}", wants[1].text)
    assert wants[2].text.startswith('{"')


@pytest.mark.parametrize(
    ("arguments", "message", "param"),
    [
        (
            {"response_format": JSON_SCHEMA, "extra_body": {"guided_regex": "a"}},
            "one structured output constraint, got response_format, guided_regex",
            "response_format",
        ),
        (
            {"extra_body": {"guided_regex": "(a"}},
            "structured_outputs.regex does not compile",
            "structured_outputs",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            'response_format of type "json_schema" needs response_format.json_schema',
            "response_format",
        ),
        (
            {"extra_body": {"structured_outputs": {"regex": "a", "json": {}}}},
            "structured_outputs must set exactly one of",
            "structured_outputs",
        ),
    ],
)
def test_bad_structured_output_requests_are_400s_naming_the_field(
    server: str, arguments: dict[str, Any], message: str, param: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=re.escape(message)) as caught:
        client(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **arguments)
    assert caught.value.status_code == 400 and caught.value.param == param
