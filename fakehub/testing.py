"""fakehub in a background thread for tests: a real HTTP server on a free local port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from fakehub.app import create_app
from fakehub.world import World


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


@dataclass
class Running:
    world: World
    url: str  # e.g. http://127.0.0.1:54321 (PyGithub's base_url, GPUCI_GITHUB_API_URL)
    server: BaseWSGIServer


@contextmanager
def serving(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[BaseWSGIServer]:
    """Any WSGI app on a real port (threaded, quiet) in a background thread, until the block
    ends."""
    server = make_server(host, port, app, threaded=True, request_handler=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="wsgi", daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def running(
    world: World, *, webhook_url: str | None = None, webhook_secret: str | None = None
) -> Iterator[Running]:
    app = create_app(world, webhook_url=webhook_url, webhook_secret=webhook_secret)
    with serving(app) as server:
        yield Running(world, f"http://127.0.0.1:{server.port}", server)
