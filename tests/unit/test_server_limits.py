"""One request cannot stall the server, and ``serve`` checks its address before loading the model.

* Bodies over ``--max-body-bytes`` get 413 in the JSON error shape (declared or chunked).
* A prompt of megabytes is tokenized off the event loop: ``/health`` and a small completion answer
  while it is processed (before: ``/health`` waited seconds, a minute for 20 MB).
* ``serve --port 99999`` (or a port in use, or a host it cannot bind) exits 2 with one ``error:`` line
  naming the value, before loading anything (before: a traceback after the model loaded).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra")
httpx = pytest.importorskip("httpx")

from server_fixtures import assert_clean_exit, free_port, make_chat_model, post, start_server  # noqa: E402

CAP = 4_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = make_chat_model(tmp_path_factory.mktemp("limits") / "tiny")
    port = free_port()
    proc = start_server(model, port, extra=["--max-body-bytes", str(CAP)], spec=None)
    yield f"http://127.0.0.1:{port}"
    assert_clean_exit(proc)


def test_a_body_over_the_cap_is_a_413(server: str) -> None:
    big = {"model": "tiny", "prompt": "x" * CAP}
    response = post(server, "/v1/completions", big)
    assert response.status_code == 413
    error = response.json()["error"]
    assert (
        error["code"] == 413
        and f"this server takes at most {CAP} (serve --max-body-bytes)" in error["message"]
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is counted as the body arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(CAP // 100_000 + 1):
            yield b"x" * 100_000
        yield b'"}'

    headers = {"content-type": "application/json"}
    response = httpx.post(f"{server}/v1/completions", content=chunks(), headers=headers, timeout=60)
    assert response.status_code == 413 and f"over {CAP} bytes" in response.json()["error"]["message"]
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_a_huge_prompt_does_not_stall_the_server(server: str) -> None:
    """While 3 MB of text is tokenized (the character tokenizer gives no characters-per-token bound,
    so it must be tokenized: seconds of CPU), ``/health`` and a small completion keep answering."""
    outcome: dict[str, httpx.Response] = {}
    latencies: dict[str, list[float]] = {"health": [], "small": []}

    def huge() -> None:
        body = {"model": "tiny", "prompt": "x" * 3_000_000}
        outcome["huge"] = post(server, "/v1/completions", body, timeout=600)

    statuses: list[int] = []

    def probe(name: str) -> None:  # until the huge request is answered
        while worker.is_alive():
            start = time.monotonic()
            if name == "health":
                response = httpx.get(f"{server}/health", timeout=600)
            else:
                response = post(server, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2})
            latencies[name].append(time.monotonic() - start)
            statuses.append(response.status_code)
            time.sleep(0.05)

    worker = threading.Thread(target=huge)
    worker.start()
    probes = [threading.Thread(target=probe, args=(name,)) for name in latencies]
    for thread in probes:
        thread.start()
    for thread in [worker, *probes]:
        thread.join()
    health, small = latencies["health"], latencies["small"]
    assert set(statuses) == {200}, statuses
    assert max(health) < 3.0 and max(small) < 10.0, (health, small)  # before: /health waited 5-10 s
    assert len(health) >= 2, "the huge request ended before the server was probed"
    response = outcome["huge"]
    assert response.status_code == 400
    assert "prompt 0 has 3000000 tokens; max_model_len=512" in response.json()["error"]["message"]


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "spec_backend.cli", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "99999"], "error: --port must be in 1..65535, got 99999"),
        (["--port", "0"], "error: --port must be in 1..65535, got 0"),
        (
            ["--host", "203.0.113.7", "--port", "8000"],
            "error: cannot listen on --host '203.0.113.7' --port 8000:",
        ),
        (["--max-body-bytes", "0"], "error: --max-body-bytes must be >= 1, got 0"),
    ],
)
def test_bad_addresses_fail_before_the_model_loads(tmp_path: Path, flags: list[str], message: str) -> None:
    """The model does not exist: an error naming the address proves it was checked first."""
    done = serve(str(tmp_path / "no-such-model"), *flags)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), done.stderr


def test_a_port_in_use_fails_before_the_model_loads(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(str(tmp_path / "no-such-model"), "--port", str(port))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: cannot listen on --host '127.0.0.1' --port {port}: "
    )
    assert "Address already in use" in lines[0]
