"""WSGI entry point: `create_app()` builds the Flask app; nothing happens at import."""

from __future__ import annotations

from flask import Flask

from bot.settings import Settings


def create_app(settings: Settings | None = None) -> Flask:
    """The web process: health today; webhooks and the dashboard register here as they land."""
    from bot import web

    settings = settings or Settings.from_env()
    app = Flask("gpuci")
    app.config["GPUCI_SETTINGS"] = settings
    app.register_blueprint(web.blueprint)
    return app
