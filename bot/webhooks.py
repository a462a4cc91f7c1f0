"""`POST /webhook`: verify the signature, drop repeated deliveries, enqueue, answer at once."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from redis import Redis
from redis.exceptions import RedisError
from rq import Queue, Retry
from werkzeug.datastructures import Headers

from bot import keys
from bot.settings import Settings

log = logging.getLogger("gpuci.webhooks")
blueprint = Blueprint("webhooks", __name__)

EVENTS_QUEUE = "gpuci-events"
HANDLER = "bot.events.handle_delivery"
# Events whose deliveries the events worker acts on; others are acknowledged and logged.
HANDLED_EVENTS = frozenset(
    {
        "pull_request",
        "issue_comment",
        "check_run",
        "check_suite",
        "installation",
        "installation_repositories",
    }
)
DELIVERY_TTL_S = 7 * 24 * 3600  # GitHub redelivers for 3 days; remember a week
# A delivery whose handling failed (GitHub 5xx, Redis hiccup) is tried again after these
# delays; handlers are idempotent, so a retry never duplicates a Check Run or a comment.
DELIVERY_RETRY_S = [10, 60, 300]


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str


def signature_of(secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` header GitHub sends for `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """HMAC-SHA256 of the raw body, compared in constant time."""
    if not secret or not header:
        return False
    return hmac.compare_digest(signature_of(secret, body), header.strip())


def check_delivery(secret: str, body: bytes, headers: Headers) -> tuple[Rejection | None, Any]:
    """Verify and parse a delivery: (None, payload) when acceptable, else (Rejection, None)."""
    if not verify_signature(secret, body, headers.get("X-Hub-Signature-256")):
        return Rejection(401, "signature missing or wrong (X-Hub-Signature-256)"), None
    if not headers.get("X-GitHub-Event"):
        return Rejection(400, "missing X-GitHub-Event header"), None
    if not headers.get("X-GitHub-Delivery"):
        return Rejection(400, "missing X-GitHub-Delivery header"), None
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejection(400, f"body is not JSON: {exc}"), None
    if not isinstance(payload, dict):
        return Rejection(400, "body must be a JSON object"), None
    return None, payload


def remember_delivery(conn: Redis, delivery_id: str) -> bool:
    """True the first time a delivery id is seen (for a week), False for a repeat."""
    return bool(conn.set(keys.delivery(delivery_id), 1, nx=True, ex=DELIVERY_TTL_S))


def enqueue_delivery(conn: Redis, event: str, delivery_id: str, payload: dict[str, Any]) -> None:
    """Put plain values on the events queue; forget the delivery again if that fails."""
    try:
        Queue(EVENTS_QUEUE, connection=conn).enqueue(
            HANDLER,
            event,
            delivery_id,
            payload,
            job_id=f"delivery-{delivery_id}",
            retry=Retry(max=len(DELIVERY_RETRY_S), interval=DELIVERY_RETRY_S),
        )
    except RedisError:
        conn.delete(keys.delivery(delivery_id))
        raise


def count_delivery(conn: Redis, event: str, outcome: str) -> None:
    """Count an answered delivery for /metrics; counting never fails the request."""
    try:
        conn.hincrby(keys.webhook_counts(), f"{event or '-'}:{outcome}", 1)
    except RedisError as exc:
        log.warning("cannot count delivery (%s:%s): %s", event, outcome, exc)


def _answer(status: int, **body: Any) -> Response:
    response = jsonify(body)
    response.status_code = status
    return response


@blueprint.post("/webhook")
def receive() -> ResponseReturnValue:
    settings: Settings = current_app.config["GPUCI_SETTINGS"]
    conn: Redis = current_app.extensions["gpuci_redis"]
    body = request.get_data(cache=False)
    headers = request.headers
    rejection, payload = check_delivery(settings.webhook_secret, body, headers)
    delivery = headers.get("X-GitHub-Delivery", "")
    event = headers.get("X-GitHub-Event", "")
    if rejection:
        log.warning("rejected delivery=%s event=%s: %s", delivery, event, rejection.message)
        count_delivery(conn, "-", "rejected")
        return _answer(rejection.status, error=rejection.message)
    if event == "ping":
        count_delivery(conn, event, "ping")
        return _answer(200, ok=True, zen=payload.get("zen", ""))
    if event not in HANDLED_EVENTS:
        log.info("ignored delivery=%s event=%s (not an event gpuci acts on)", delivery, event)
        count_delivery(conn, event, "ignored")
        return _answer(202, accepted=True, handled=False)
    try:
        if not remember_delivery(conn, delivery):
            log.info("duplicate delivery=%s event=%s: already queued", delivery, event)
            count_delivery(conn, event, "duplicate")
            return _answer(202, accepted=True, duplicate=True)
        enqueue_delivery(conn, event, delivery, payload)
    except RedisError as exc:
        log.error("redis unavailable, delivery=%s event=%s not queued: %s", delivery, event, exc)
        count_delivery(conn, event, "unavailable")
        return _answer(503, error="queue unavailable, retry later")
    log.info("queued delivery=%s event=%s action=%s", delivery, event, payload.get("action"))
    count_delivery(conn, event, "queued")
    return _answer(202, accepted=True, handled=True)
