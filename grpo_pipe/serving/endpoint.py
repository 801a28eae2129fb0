"""The run's engine on an HTTP port: `EngineEndpoint` starts the OpenAI-compatible routes (`openai_api`) on a
uvicorn server in a thread of this process, on 127.0.0.1 unless told otherwise, with a fresh bearer token that the
run hands to the processes it starts (`base_url`, `token`)."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from typing import Any

import uvicorn

from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.serving.batcher import RequestBatcher
from grpo_pipe.serving.openai_api import ServedModel, build_app, new_token
from grpo_pipe.serving.served_log import ServedLog

log = logging.getLogger(__name__)


class EngineEndpoint:
    """Serves `engine` over HTTP while it runs; `start()` returns once the port answers, `stop()` within seconds.

    Args:
        engine: The engine the requests are served by.
        model: The served model's name and tokenizer, and the engine's limits.
        host: The address it listens on: a loopback address unless `allow_remote`.
        port: The port it listens on; 0: a free one.
        token: The bearer token every request must carry; None: a fresh random one.
        allow_remote: Allow a host other machines can reach (behind your own network controls).
        request_timeout_s: A request the engine has not answered in this long gets an error reply.
    """

    def __init__(self, *, engine: RolloutEngine, model: ServedModel, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, allow_remote: bool = False, request_timeout_s: float = 600.0) -> None:
        if not allow_remote and not _is_loopback(host):
            raise ValueError(f"endpoint host {host!r} is not a loopback address: the engine would answer other "
                             "machines; use 127.0.0.1, or allow_remote=true behind your own network controls")
        self.engine, self.model, self.host, self.port = engine, model, host, port
        self.token = token or new_token()
        self.request_timeout_s = request_timeout_s
        self.served = ServedLog()  # what the engine sampled, to check scored groups against (`episodes.scored_groups`)
        self.batcher: RequestBatcher | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (`.../v1`); vLLM's `/generate` and `/health` are at its root."""
        return f"http://{self.host}:{self.port}/v1"

    def start(self, ready_timeout_s: float = 30.0) -> None:
        self.batcher = RequestBatcher(engine=self.engine, served=self.served)
        app = build_app(self.batcher, self.model, self.token, self.request_timeout_s)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the run owns signals
        self._thread = threading.Thread(target=self._server.run, name="grpo-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + ready_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the engine endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = _bound_port(self._server) or self.port
        log.info("engine endpoint serving %s on %s", self.model.name, self.base_url)

    def pause(self) -> None:
        """Finish the engine call in flight and hold requests back: the engine is the run's until `resume`."""
        if self.batcher is not None:
            self.batcher.pause()

    def resume(self) -> None:
        if self.batcher is not None:
            self.batcher.resume()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.batcher is not None:
            self.batcher.close()

    def __enter__(self) -> EngineEndpoint:
        self.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bound_port(server: uvicorn.Server) -> int | None:
    """The port the OS gave a server started on port 0."""
    for listener in getattr(server, "servers", []):
        for sock in getattr(listener, "sockets", []):
            return int(sock.getsockname()[1])
    return None
