"""HTTP views of the web process: health and metrics endpoints."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue
from redis.exceptions import RedisError

from bot.settings import Settings

blueprint = Blueprint("gpuci", __name__)


def settings() -> Settings:
    value: Settings = current_app.config["GPUCI_SETTINGS"]
    return value


@blueprint.get("/healthz")
def healthz() -> ResponseReturnValue:
    """200 when Redis answers, 503 with the reason otherwise."""
    try:
        current_app.extensions["gpuci_redis"].ping()
    except RedisError as exc:
        return jsonify(ok=False, redis=f"unreachable: {exc}"), 503
    return jsonify(ok=True, redis="ok")
