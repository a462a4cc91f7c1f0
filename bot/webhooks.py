"""`POST /webhook`: verify the signature, drop repeated deliveries, put the rest in the inbox
(bot/inbox.py: one Redis call) and answer at once.

`Intake` answers it as WSGI middleware in front of the Flask app (`app.wsgi_app`), so a
delivery does not pay for Flask's request and response machinery, which cost about a third of
the rest. Every other path goes on to Flask."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from redis import Redis
from redis.exceptions import RedisError
from werkzeug.datastructures import EnvironHeaders, Headers
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge
from werkzeug.wsgi import get_input_stream

from bot import keys
from bot.inbox import Inbox
from bot.settings import Settings

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("gpuci.webhooks")
PATH = "/webhook"

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


def count_delivery(conn: Redis, event: str, outcome: str) -> None:
    """Count an answered delivery for /metrics; counting never fails the request."""
    try:
        conn.hincrby(keys.webhook_counts(), f"{event or '-'}:{outcome}", 1)
    except RedisError as exc:
        log.warning("cannot count delivery (%s:%s): %s", event, outcome, exc)


Answer = tuple[int, dict[str, Any]]
QUEUED: Answer = (202, {"accepted": True, "handled": True})


class Intake:
    """WSGI middleware: `POST /webhook` answered here, everything else passed to `app`."""

    def __init__(self, app: WSGIApplication, settings: Settings, conn: Redis) -> None:
        self.app, self.settings, self.conn = app, settings, conn
        self.inbox = Inbox(conn)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            answer: Answer = (405, {"error": f"{PATH} accepts POST only (GitHub's deliveries)"})
            return _respond(start_response, answer, [("Allow", "POST")])
        try:
            body = get_input_stream(environ, max_content_length=self.settings.max_body_bytes).read()
            answer = self.receive(body, EnvironHeaders(environ))
        except RequestEntityTooLarge:
            limit = self.settings.max_body_bytes
            answer = (413, {"error": f"body over the {limit}-byte limit (GPUCI_MAX_BODY_BYTES)"})
        except ClientDisconnected:
            answer = (400, {"error": "the body ended before its Content-Length"})
        except Exception:
            log.exception("unexpected error receiving a delivery")
            answer = (500, {"error": "internal error; see the gpuci web log"})
        return _respond(start_response, answer)

    def receive(self, body: bytes, headers: Headers) -> Answer:
        """Verify, deduplicate and keep one delivery: (HTTP status, JSON body)."""
        conn = self.conn
        rejection, payload = check_delivery(self.settings.webhook_secret, body, headers)
        delivery = headers.get("X-GitHub-Delivery", "")
        event = headers.get("X-GitHub-Event", "")
        if rejection:
            log.warning("rejected delivery=%s event=%s: %s", delivery, event, rejection.message)
            count_delivery(conn, "-", "rejected")
            return rejection.status, {"error": rejection.message}
        if event == "ping":
            count_delivery(conn, event, "ping")
            return 200, {"ok": True, "zen": payload.get("zen", "")}
        if event not in HANDLED_EVENTS:
            log.info("ignored delivery=%s event=%s (not an event gpuci acts on)", delivery, event)
            count_delivery(conn, event, "ignored")
            return 202, {"accepted": True, "handled": False}
        try:
            queued = self.inbox.accept(event, delivery, body)
        except RedisError as exc:
            log.error(
                "redis unavailable, delivery=%s event=%s not queued: %s", delivery, event, exc
            )
            count_delivery(conn, event, "unavailable")
            return 503, {"error": "queue unavailable, retry later"}
        if not queued:
            log.info("duplicate delivery=%s event=%s: already queued", delivery, event)
            return 202, {"accepted": True, "duplicate": True}
        log.info("queued delivery=%s event=%s action=%s", delivery, event, payload.get("action"))
        return QUEUED


def _respond(
    start_response: StartResponse, answer: Answer, extra: list[tuple[str, str]] | None = None
) -> list[bytes]:
    status, fields = answer
    body = json.dumps(fields).encode() + b"\n"
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    start_response(f"{status} {HTTPStatus(status).phrase}", headers + (extra or []))
    return [body]
