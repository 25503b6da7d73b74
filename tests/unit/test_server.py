"""``spec-backend serve`` driven by the real ``openai`` client: a tiny model, ngram speculation (K=3).

The server runs as a subprocess on a free local port, exactly as a user starts it. Greedy answers are
compared token for token (text of a character-level tokenizer) with offline ``LLM.generate`` on the
same model and configuration.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the openai client (test extra)")
pytest.importorskip("fastapi", reason="the server needs the serve extra")
httpx = pytest.importorskip("httpx")

from server_fixtures import (  # noqa: E402
    SPEC,
    assert_clean_exit,
    client,
    free_port,
    make_chat_model,
    served,
    start_server,
)

from spec_backend.engine import LLM, SamplingParams  # noqa: E402
from spec_backend.tools.tiny import make_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_chat_model(tmp_path_factory.mktemp("served") / "tiny")


@pytest.fixture(scope="module")
def slow_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Wide and deep enough that a 4,000-token answer takes far longer than the abort tests wait
    (measured here: ~26 ms per token, 1,000 tokens in 26 s)."""
    return make_tiny_model(
        tmp_path_factory.mktemp("slow") / "slow",
        vocab_size=128,
        with_tokenizer=True,
        max_position_embeddings=8192,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
    )


@pytest.fixture(scope="module")
def server(model_dir: str) -> Iterator[str]:
    yield from served(model_dir)


@pytest.fixture(scope="module")
def offline(model_dir: str) -> LLM:
    return LLM(model_dir, speculative_config=SPEC, max_num_seqs=8)


def greedy(offline: LLM, prompts: list[str], max_tokens: int) -> list[str]:
    outs = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [o.outputs[0].text for o in outs]


def test_completion_equals_offline_generate(server: str, offline: LLM) -> None:
    got = client(server).completions.create(model="tiny", prompt="hello world", max_tokens=20, temperature=0)
    assert got.choices[0].text == greedy(offline, ["hello world"], 20)[0]
    assert got.choices[0].finish_reason == "length"
    assert got.usage is not None and got.usage.completion_tokens == 20 and got.usage.prompt_tokens == 11


def test_usage_reports_the_prompt_tokens_the_prefix_cache_served(server: str, offline: LLM) -> None:
    """The same long prompt twice: the second time every whole 16-token block (at most the prompt minus
    one token) comes from the prefix cache, ``usage.prompt_tokens_details.cached_tokens`` says how
    many, and the answer is unchanged (and equals offline generation without the cache)."""
    prompt = "usage check: " + "the quick brown fox jumps over the lazy dog " * 2  # 101 characters
    want = greedy(offline, [prompt], 12)[0]
    api = client(server)
    before = _prefix_counters(server)
    calls = [api.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0) for _ in "ab"]
    assert [c.choices[0].text for c in calls] == [want, want]
    details = [c.usage.prompt_tokens_details for c in calls if c.usage is not None]
    assert [d.cached_tokens for d in details if d is not None] == [0, 96]
    prompt_tokens = calls[0].usage.prompt_tokens if calls[0].usage is not None else 0
    after = _prefix_counters(server)  # /metrics: tokens looked up and served, ours and vLLM's names
    assert {k: after[k] - before.get(k, 0.0) for k in after} == {
        "spec_backend_prefix_cache_queries_total": 2.0 * prompt_tokens,
        "spec_backend_prefix_cache_hits_total": 96.0,
        "vllm:prefix_cache_queries_total": 2.0 * prompt_tokens,
        "vllm:prefix_cache_hits_total": 96.0,
    }


def test_a_cache_salt_keeps_prefix_blocks_apart(server: str) -> None:
    """vLLM's ``cache_salt`` request field: the second request with the same salt finds the first one's
    blocks; another salt, or none, does not; answers are the same; an empty salt is a 400."""
    prompt = "salted prompt: " + "pack my box with five dozen liquor jugs " * 2
    api = client(server)

    def cached(salt: str | None) -> tuple[int | None, str, int]:
        extra = {"cache_salt": salt} if salt is not None else {}
        got = api.completions.create(
            model="tiny", prompt=prompt, max_tokens=6, temperature=0, extra_body=extra
        )
        details = got.usage.prompt_tokens_details if got.usage is not None else None
        length = got.usage.prompt_tokens if got.usage is not None else 0
        return (details.cached_tokens if details is not None else None), got.choices[0].text, length

    runs = [cached("tenant-1"), cached("tenant-1"), cached("tenant-2"), cached(None)]
    length = runs[0][2]  # every whole block, at most the prompt minus one token
    assert [c for c, _, _ in runs] == [0, min(length // 16 * 16, length - 1), 0, 0] and length > 32
    assert len({t for _, t, _ in runs}) == 1
    with pytest.raises(openai.BadRequestError, match="cache_salt: String should have at least 1 character"):
        cached("")


def _prefix_counters(server: str) -> dict[str, float]:
    lines = httpx.get(f"{server}/metrics").text.splitlines()
    return {
        line.split()[0]: float(line.split()[1])
        for line in lines
        if "prefix_cache_" in line and not line.startswith("#") and "_created" not in line
    }


def test_streaming_completion_equals_the_whole(server: str, offline: LLM) -> None:
    stream = client(server).completions.create(
        model="tiny", prompt="abcabcabc", max_tokens=24, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == greedy(offline, ["abcabcabc"], 24)[0]
    assert [c.choices[0].finish_reason for c in chunks][-1] == "length"


def test_chat_streaming_and_not(server: str, offline: LLM) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    prompt = "<system>be brief\n<user>hi there\n<assistant>"
    expected = greedy(offline, [prompt], 16)[0]
    api = client(server)
    whole = api.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    chunks = list(
        api.chat.completions.create(
            model="tiny", messages=messages, max_tokens=16, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected


def test_penalties_and_vllm_extensions_reach_the_engine(server: str, offline: LLM) -> None:
    """OpenAI's penalties and vLLM's extra fields give what offline generate gives with the same
    SamplingParams, and change the text (negative control: they are not dropped)."""
    extra = {"repetition_penalty": 1.4, "min_tokens": 10, "stop_token_ids": [5], "min_p": 0.1}
    got = client(server).completions.create(
        model="tiny",
        prompt="abcabcabc",
        max_tokens=20,
        temperature=0,
        presence_penalty=0.8,
        frequency_penalty=0.5,
        logit_bias={"7": 3.0},
        extra_body=extra,
    )
    params = SamplingParams(
        temperature=0,
        max_tokens=20,
        presence_penalty=0.8,
        frequency_penalty=0.5,
        logit_bias={7: 3.0},
        **extra,  # type: ignore[arg-type]
    )
    expected = offline.generate(["abcabcabc"], params)[0].outputs[0].text
    assert got.choices[0].text == expected
    assert expected != greedy(offline, ["abcabcabc"], 20)[0]


def test_seeded_sampling_reproduces_and_differs_across_seeds(server: str) -> None:
    api = client(server)

    def sample(seed: int) -> str:
        got = api.completions.create(model="tiny", prompt="xyz", max_tokens=24, temperature=1.0, seed=seed)
        return str(got.choices[0].text)

    assert sample(5) == sample(5)
    assert len({sample(s) for s in range(4)}) > 1  # negative control: the seed is honoured


def test_64_concurrent_streams_all_complete(server: str, offline: LLM) -> None:
    """Continuous batching under load: 64 streaming clients at once (batch 8 on the server), every
    answer complete, each exactly its own greedy text (none lost, duplicated or mixed up)."""
    prompts = [f"request {i}: " + "ab" * (i % 5) for i in range(64)]

    async def one(api: Any, prompt: str) -> str:
        stream = await api.completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True
        )
        return "".join([c.choices[0].text async for c in stream])

    async def run() -> list[str]:
        api = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
        return list(await asyncio.gather(*(one(api, p) for p in prompts)))

    assert asyncio.run(run()) == greedy(offline, prompts, 12)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "gpt-4", "prompt": "x"}, 404, "model 'gpt-4' does not exist; this server serves 'tiny'"),
        ({"model": "tiny", "prompt": "x", "max_tokens": -1}, 400, "max_tokens: Input should be greater than"),
        ({"model": "tiny", "prompt": "x", "n": 0}, 400, "n: Input should be greater than or equal to 1"),
        (
            {"model": "tiny", "prompt": "x", "logprobs": 21},
            400,
            "logprobs: Input should be less than or equal to 20",
        ),
        ({"model": "tiny", "prompt": "x", "best_of": 2}, 400, "best_of: Extra inputs are not permitted"),
        ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p: Input should be greater than 0"),
        (
            {"model": "tiny", "prompt": "x", "presence_penalty": 5},
            400,
            "presence_penalty must be in [-2.0, 2.0], got 5",
        ),
        ({"model": "tiny", "prompt": "x", "logit_bias": {"99999": 1}}, 400, "outside the vocabulary"),
        (
            {"model": "tiny", "prompt": "x", "echo": True, "stream": True},
            400,
            "echo=true is not supported with",
        ),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens must be >= 1, got 0"),
    ],
)
def test_bad_requests_get_openai_errors(server: str, body: dict[str, Any], status: int, message: str) -> None:
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status


def test_malformed_json_is_a_400(server: str) -> None:
    response = httpx.post(
        f"{server}/v1/completions", content=b"{bad json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "JSON decode error" in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client(server).completions.create(model="other", prompt="x")


def test_models_health_metrics(server: str) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    metrics = httpx.get(f"{server}/metrics").text
    assert "spec_decode_num_drafts" in metrics and "spec_decode_num_draft_tokens" in metrics


def test_batch_of_prompts_in_one_request(server: str, offline: LLM) -> None:
    got = client(server).completions.create(
        model="tiny", prompt=["one", "two", "three"], max_tokens=8, temperature=0
    )
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == greedy(
        offline, ["one", "two", "three"], 8
    )


def wait_idle(base: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        health: dict[str, Any] = httpx.get(f"{base}/health").json()
        if health["num_requests_running"] == 0 and health["num_requests_waiting"] == 0:
            return health
        if time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_disconnected_client_frees_its_slot(slow_model_dir: str) -> None:
    """A streaming client that goes away mid-answer: its request is aborted and leaves the batch at
    once (it had 4,000 tokens to go), and the server keeps answering."""
    port = free_port()
    proc = start_server(slow_model_dir, port)
    base = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "prompt": "go", "max_tokens": 4000, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()  # kept open: leaving its loop would close the connection already
        line = next(lines)
        assert line.startswith("data: {") and '"finish_reason": null' in line, line
        assert httpx.get(f"{base}/health").json()["num_requests_running"] == 1
    health = wait_idle(base)  # the with-block closed the connection: the client is gone
    assert health["num_requests_running"] == 0, health
    assert "spec_backend_server_requests_aborted_total 1.0" in httpx.get(f"{base}/metrics").text
    assert client(base).completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].text
    assert_clean_exit(proc)


def test_sigterm_with_a_request_in_flight(slow_model_dir: str) -> None:
    """Shutdown while a client streams a long answer: the stream ends with an explicit error event and
    ``[DONE]``, and the server shuts down cleanly."""
    port = free_port()
    proc = start_server(slow_model_dir, port)
    lines: list[str] = []
    body = {"model": "tiny", "prompt": "go", "max_tokens": 4000, "temperature": 0, "stream": True}

    def consume() -> None:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60) as r:
            lines.extend(line for line in r.iter_lines() if line)

    reader = threading.Thread(target=consume)
    reader.start()
    while not lines and reader.is_alive():
        time.sleep(0.02)
    assert_clean_exit(proc)
    reader.join(timeout=60)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: ") :])
    assert last["error"]["message"] == "generation failed: server shutting down", last
