"""Run fakehub as an HTTP server (what `gpuci fakehub` calls)."""

from __future__ import annotations

import logging
from pathlib import Path

from werkzeug.serving import make_server

from fakehub.app import create_app
from fakehub.world import load_world

log = logging.getLogger(__name__)


def serve(
    world_path: Path,
    host: str,
    port: int,
    webhook_url: str | None,
    webhook_secret: str | None,
) -> None:
    """Load the world file and serve it until interrupted (threaded: webhook receivers may call
    back while a delivery is in flight)."""
    world = load_world(Path(world_path))
    app = create_app(world, webhook_url=webhook_url, webhook_secret=webhook_secret)
    server = make_server(host, port, app, threaded=True)
    log.info(
        "fakehub on http://%s:%d: app %d (%s), %d repositories, webhooks to %s",
        host,
        server.port,
        world.app.id,
        world.app.slug,
        len(world.repos),
        world.app.webhook_url or "(none: recorded as not delivered)",
    )
    print(f"fakehub listening on http://{host}:{server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
