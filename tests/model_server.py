"""A real OpenAI-compatible model server on loopback: llama-cpp-python's, with Gemma 3 270M (both installed by
tools/install_model_server.py), and a recording proxy in front that keeps every request and answer.

The model is served under three names, each a way real servers are set up (one server process each):
- `gemma-tools`: llama-cpp-python's `chatml-function-calling` format, which answers with real tool calls
  (grammar-constrained) when `tool_choice` is "auto" and leaves the tools out of the prompt when it is missing;
  it drops tool messages' content, so the model never reads a tool's result;
- `gemma-template`: a Jinja chat template (tests/fixtures/model_server/gemma3_chat.json, the GGUF has none)
  that puts the tools and the tool results in the prompt; its replies are text;
- `gemma-small`: `gemma-tools` with a 1,024-token context, too small for the agent's first request.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = ROOT / ".tools" / "model-server"
PYTHON = INSTALLED / "venv" / "bin" / "python"
GGUF = INSTALLED / "gemma3-270m-q4_k_m.gguf"
TEMPLATE_CONFIG = Path(__file__).parent / "fixtures" / "model_server" / "gemma3_chat.json"
NOT_INSTALLED = ("llama-cpp-python's server and the Gemma 3 270M model are not installed in .tools/model-server: "
                 "run `python3 tools/install_model_server.py` (it builds llama.cpp from source)")
TOOLS, TEMPLATE, SMALL = "gemma-tools", "gemma-template", "gemma-small"
SMALL_CONTEXT = 1024


def installed() -> bool:
    return PYTHON.exists() and GGUF.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model(alias: str) -> dict[str, Any]:
    # one thread: on two cores shared with other work, llama.cpp's spinning threads wait on each other (a second
    # thread made generation four times slower here, and prompt reading no faster)
    common = {"model": str(GGUF), "model_alias": alias, "n_ctx": 4096, "n_threads": 1, "n_threads_batch": 1,
              "verbose": False, "chat_format": "chatml-function-calling"}
    if alias == TEMPLATE:
        return {**common, "chat_format": "hf-tokenizer-config", "hf_tokenizer_config_path": str(TEMPLATE_CONFIG)}
    return {**common, "n_ctx": SMALL_CONTEXT} if alias == SMALL else common


@contextmanager
def llama_server(work: Path, alias: str, ready_seconds: float = 180) -> Iterator[str]:
    """The server with the model as `alias` on a free loopback port, until the block ends; its base URL (…/v1).
    One process per name: each keeps its own prompt cache, and work one test abandoned holds up no other."""
    port = _free_port()
    config = work / f"{alias}.json"
    config.write_text(json.dumps({"host": "127.0.0.1", "port": port, "models": [_model(alias)]}))
    log_path = work / f"{alias}.log"
    log = log_path.open("wb")
    launcher = Path(__file__).with_name("llama_server.py")
    process = subprocess.Popen([str(PYTHON), str(launcher), "--config_file", str(config)], stdout=log,
                               stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": ""})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the model server exited ({process.returncode}): {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the model server did not start in {ready_seconds:g} s")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(20)
        log.close()


class LlamaServers:
    """One server per model name, started when a test first asks for it, all stopped at `close`."""

    def __init__(self, work: Path):
        self.work = work
        self.stack = ExitStack()
        self.urls: dict[str, str] = {}

    def url(self, alias: str) -> str:
        if alias not in self.urls:
            self.urls[alias] = self.stack.enter_context(llama_server(self.work, alias))
        return self.urls[alias]

    def close(self) -> None:
        self.stack.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # an answer the gateway gave up on must not hold the teardown

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client left before the answer: as the test intended


class RecordingProxy:
    """Forwards every request to the server and keeps it with its answer: what the gateway sent, what came back."""

    def __init__(self, upstream: str):
        self.sent: list[dict[str, Any]] = []  # every request body, kept as it arrives
        self.exchanges: list[tuple[dict[str, Any], int, Any]] = []  # (request body, status, answer), as answered
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._forward(None)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                proxy.sent.append(json.loads(body))
                self._forward(body)

            def _forward(self, body: bytes | None) -> None:
                answer = httpx.request(self.command, upstream.removesuffix("/v1") + self.path, content=body,
                                       headers={"Content-Type": "application/json"}, timeout=900)
                if body is not None:
                    try:
                        said = answer.json()
                    except ValueError:
                        said = answer.text
                    proxy.exchanges.append((json.loads(body), answer.status_code, said))
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def requests(self) -> list[dict[str, Any]]:
        """Every chat completion request sent, in order (an abandoned one too)."""
        return [body for body in self.sent if "messages" in body]

    def answers(self) -> list[Any]:
        """What the server answered to each chat completion it finished, in order."""
        return [said for body, _, said in self.exchanges if "messages" in body]

    def __enter__(self) -> RecordingProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
