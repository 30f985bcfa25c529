"""A real OpenAI-compatible HTTP server on 127.0.0.1 that answers from a script, for litellm tests.

`POST /v1/chat/completions` gets the next scripted `Reply` (or the one a function picks from the
request) in OpenAI JSON, `usage` included. Bounded: at most `max_requests` answers (later ones get a
400), and the server stops itself after `max_seconds` even if a test forgets to.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a message (status 200) or an error status, optionally after a delay."""

    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    prompt_tokens: int = 1000
    completion_tokens: int = 200


Script = Sequence[Reply] | Callable[[dict[str, Any], int], Reply]


class FakeLLMServer:
    """Use as a context manager; `api_base` is what litellm needs, `requests` what the server saw."""

    def __init__(self, script: Script, max_requests: int = 20, max_seconds: float = 30.0) -> None:
        self.script = script
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._timer = threading.Timer(max_seconds, self.stop)
        self._timer.daemon = True

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeLLMServer":
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (idempotent); a sleeping answer is abandoned."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def _reply_for(self, body: dict[str, Any], n: int) -> Reply:
        if n >= self.max_requests:
            return Reply(json.dumps({"error": {"message": "fake server: request limit reached"}}), status=400)
        if callable(self.script):
            return self.script(body, n)
        if n >= len(self.script):
            return Reply(json.dumps({"error": {"message": "fake server: script exhausted"}}), status=400)
        return self.script[n]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                return None

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with fake._lock:
                    n = len(fake.requests)
                    fake.requests.append(body)
                    fake.headers.append(dict(self.headers))
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    reply = fake._reply_for(body, n)
                    if reply.delay_s and fake._stopped.wait(reply.delay_s):
                        return
                    if reply.status != 200:
                        err = reply.content or json.dumps({"error": {"message": f"scripted {reply.status}"}})
                        self._send(reply.status, err.encode())
                        return
                    self._send(200, json.dumps(_completion(body, reply)).encode())
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (timeout); nothing to answer
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

        return Handler


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def prompt_of(body: dict[str, Any]) -> str:
    """The user prompt of a chat request."""
    return body["messages"][-1]["content"]


# Scripted answers and the parent they answer about: warp_row for bf16 rows.

OP_DESCRIPTION = "RMSNorm forward: y[m, n] = x[m, n] * rsqrt(mean_n(x[m, :]^2) + eps) * w[n]; rows of length N."
BF16 = {"x": "bfloat16", "w": "bfloat16"}


def parent_request(**changes: Any) -> Any:
    """A mutation request for rmsnorm's warp_row at its defaults, rendered for bf16."""
    from evo.core.genome import Genome
    from evo.llm import Measurements, MutationRequest
    from evo.templates.render import render
    from evo.templates.template import load_templates

    t = load_templates("rmsnorm")["warp_row"]
    g = Genome.make(t.op, t.name, t.source_hash, t.default_params())
    src = render(t, t.default_params(), 90, BF16, {}).source
    req = MutationRequest(
        parent=g,
        template_text=t.text,
        rendered_source=src,
        op_description=OP_DESCRIPTION,
        measurements=Measurements("bf16 M=4096 N=4096", time_us=21.4, pct_of_ceiling=78.0, regs=79, spills=0),
        lessons=("vec=8 with load_hint='nc' was fastest for bf16 so far",),
        failures=("cta_row threads=1024 min_blocks=4: RESOURCE_ERROR (regs x threads > 65536)",),
        dtypes=BF16,
    )
    return dataclasses.replace(req, **changes) if changes else req


def whole(text: str, lang: str = "jinja") -> str:
    """An answer holding a whole template in a fenced block."""
    return f"Rationale: a different launch shape.\n\n```{lang}\n{text.rstrip()}\n```\n"


def edits(*pairs: tuple[str, str]) -> str:
    """An answer holding SEARCH/REPLACE edits."""
    blocks = [f"<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE" for s, r in pairs]
    return "Rationale: a small change.\n\n" + "\n\n".join(blocks) + "\n"


def improved_warp_row(parent_text: str) -> str:
    """A small valid change: 256 threads by default, and unroll may also be 8."""
    return parent_text.replace("[defaults]\nthreads = 128", "[defaults]\nthreads = 256").replace(
        "unroll = [1, 2, 4]", "unroll = [1, 2, 4, 8]"
    )
