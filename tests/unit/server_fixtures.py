"""Helpers of the server tests (``test_server*.py``): a tiny model with a chat template, and
``spec-backend serve`` started as a subprocess on a free local port, exactly as a user starts it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from spec_backend.tools.tiny import make_tiny_model

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_chat_model(directory: Path) -> str:
    """A tiny random Llama (vocabulary 128) with its character-level tokenizer and ``TEMPLATE``."""
    path = make_tiny_model(directory, vocab_size=128, with_tokenizer=True)
    Path(path, "chat_template.jinja").write_text(TEMPLATE)
    return path


def start_server(
    model_dir: str, port: int, extra: list[str] | None = None, spec: dict[str, Any] | None = SPEC
) -> subprocess.Popen[str]:
    """``spec-backend serve`` (served as ``tiny``, batch 8, ``spec`` speculation), up and healthy."""
    command = [sys.executable, "-m", "spec_backend.cli", "serve", model_dir, "--port", str(port)]
    command += ["--served-model-name", "tiny", "--max-num-seqs", "8", *(extra or [])]
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server did not come up in 120 s")


def assert_clean_exit(proc: subprocess.Popen[str]) -> None:
    """SIGTERM ends the server gracefully: uvicorn finishes the application's shutdown, then re-raises
    the signal (exit status -15), as it does for any graceful stop."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM), out[-3000:]
    assert "Application shutdown complete" in out, out[-3000:]


def served(model_dir: str) -> Iterator[str]:
    """A module fixture's body: the server on a free port, its base URL, and a clean exit at the end."""
    port = free_port()
    proc = start_server(model_dir, port)
    yield f"http://127.0.0.1:{port}"
    assert_clean_exit(proc)


def client(base: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)


def post(base: str, route: str, body: dict[str, Any] | bytes, timeout: float = 60) -> httpx.Response:
    """POST a JSON body (or raw bytes sent as JSON) to ``route``."""
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        return httpx.post(f"{base}{route}", content=body, headers=headers, timeout=timeout)
    return httpx.post(f"{base}{route}", json=body, timeout=timeout)


def sse_payloads(base: str, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of a streamed response (``data: [DONE]`` checked and dropped)."""
    with httpx.stream("POST", f"{base}{route}", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]
