"""WSGI entry point: `create_app()` builds the Flask app; nothing happens at import."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue
from redis import Redis
from werkzeug.exceptions import HTTPException

from contract.logs import configure
from contract.settings import Settings

log = logging.getLogger("gpuci.web")


def create_app(settings: Settings | None = None, redis: Redis | None = None) -> Flask:
    """The web process: webhooks, health, metrics and the dashboard."""
    from bot import accesslog, dashboard, metrics, web, webhooks

    if settings is None:  # the server's own entry point ('app:create_app()' under gunicorn)
        settings = Settings.from_env()
        configure(settings.log_format)  # gpuci's log lines as every process writes them
    accesslog.install()  # request lines never show the dashboard token
    app = Flask("gpuci")
    app.config["GPUCI_SETTINGS"] = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    conn = redis or Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    app.extensions["gpuci_redis"] = conn
    app.register_blueprint(web.blueprint)
    app.register_blueprint(metrics.blueprint)
    app.register_blueprint(dashboard.blueprint)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    app.wsgi_app = webhooks.Intake(app.wsgi_app, settings, conn)  # type: ignore[method-assign]
    return app


def _http_error(exc: HTTPException) -> ResponseReturnValue:
    """Every HTTP error as JSON with a sentence a caller can act on."""
    return jsonify(error=exc.description or exc.name), exc.code or 500


def _unexpected_error(exc: Exception) -> ResponseReturnValue:
    log.exception("unexpected error")
    return jsonify(error="internal error; see the gpuci web log"), 500
