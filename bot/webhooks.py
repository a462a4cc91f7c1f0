"""`POST /webhook`: verify the signature, drop repeated deliveries, put the rest in the inbox
(bot/inbox.py: one Redis call) and answer at once.

`triage` decides what a delivery gets from its body and headers alone; what is left is the
inbox call. The web process's server (bot/server.py) answers the path itself with
`AsyncIntake`, which shares one Redis connection between the deliveries in flight; `Intake`
answers it as WSGI middleware in front of the Flask app (`app.wsgi_app`) for any other WSGI
server (Flask's test client, `fakehub.testing.serving`). Every other path goes on to Flask."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol

from redis import Redis
from redis.exceptions import RedisError
from werkzeug.datastructures import EnvironHeaders
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge
from werkzeug.wsgi import get_input_stream

from bot.inbox import (
    _ACCEPT,
    DELIVERY_TTL_S,
    Accepted,
    Envelope,
    Inbox,
    accept_args,
    accept_keys,
)
from bot.redis_pipe import RedisPipe
from contract import keys
from contract.settings import Settings

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

Answer = tuple[int, dict[str, Any]]
QUEUED: Answer = (202, {"accepted": True, "handled": True})
DUPLICATE: Answer = (202, {"accepted": True, "duplicate": True})
UNAVAILABLE: Answer = (503, {"error": "queue unavailable, retry later"})
NOT_POST: Answer = (405, {"error": f"{PATH} accepts POST only (GitHub's deliveries)"})
NOT_POST_HEADERS = [("Allow", "POST")]


class Headers(Protocol):
    def get(self, key: str, /) -> str | None: ...


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str


@dataclass(frozen=True)
class Reply:
    """A delivery answered without the inbox: its answer and its /metrics count."""

    answer: Answer
    event: str
    outcome: str


@dataclass(frozen=True)
class Keep:
    """A verified delivery of an event gpuci acts on: it goes into the inbox."""

    event: str
    delivery_id: str
    action: Any
    body: bytes


def signature_of(secret: str, body: bytes) -> str:
    """The `X-Hub-Signature-256` header GitHub sends for `body`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_problem(secret: str, body: bytes, header: str | None) -> str | None:
    """Why `header` is not GitHub's signature of `body` (HMAC-SHA256 of the raw body), or None.
    The header is compared as bytes, in constant time: any text a client sends is an answer,
    never an exception."""
    if not secret:
        return "signature cannot be checked: no webhook secret is set"
    if not header:
        return "signature missing (X-Hub-Signature-256)"
    given = header.strip().encode("utf-8", "replace")
    expected = b"sha256=" + hmac.digest(secret.encode(), body, "sha256").hex().encode()
    if hmac.compare_digest(expected, given):
        return None
    if not _SIGNATURE_FORM.fullmatch(given):
        return "signature malformed (X-Hub-Signature-256 must be sha256= and 64 hex digits)"
    return "signature wrong (X-Hub-Signature-256 does not match the body and the secret)"


_SIGNATURE_FORM = re.compile(rb"sha256=[0-9a-f]{64}")


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """HMAC-SHA256 of the raw body, compared in constant time."""
    return signature_problem(secret, body, header) is None


def check_delivery(secret: str, body: bytes, headers: Headers) -> tuple[Rejection | None, Any]:
    """Verify and parse a delivery: (None, payload) when acceptable, else (Rejection, None)."""
    problem = signature_problem(secret, body, headers.get("X-Hub-Signature-256"))
    if problem is not None:
        return Rejection(401, problem), None
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


def triage(secret: str, body: bytes, headers: Headers) -> Reply | Keep:
    """What a delivery gets before any Redis call: an answer, or a place in the inbox."""
    rejection, payload = check_delivery(secret, body, headers)
    delivery = headers.get("X-GitHub-Delivery") or ""
    event = headers.get("X-GitHub-Event") or ""
    if rejection:
        log.warning("rejected delivery=%s event=%s: %s", delivery, event, rejection.message)
        return Reply((rejection.status, {"error": rejection.message}), "-", "rejected")
    if event == "ping":
        return Reply((200, {"ok": True, "zen": payload.get("zen", "")}), event, "ping")
    if event not in HANDLED_EVENTS:
        log.info("ignored delivery=%s event=%s (not an event gpuci acts on)", delivery, event)
        return Reply((202, {"accepted": True, "handled": False}), event, "ignored")
    return Keep(event, delivery, payload.get("action"), body)


def kept(delivery: Keep, outcome: Accepted) -> Answer:
    """The answer once the inbox took the delivery or knew it already: its id (a
    redelivery) or its body under another id (a replay)."""
    if outcome is Accepted.REPLAYED:
        log.warning(
            "replayed delivery=%s event=%s: the same body came under another delivery id "
            "within %d days; not queued",
            delivery.delivery_id,
            delivery.event,
            DELIVERY_TTL_S // 86400,
        )
        return DUPLICATE
    if outcome is Accepted.DUPLICATE:
        log.info(
            "duplicate delivery=%s event=%s: already queued", delivery.delivery_id, delivery.event
        )
        return DUPLICATE
    log.info(
        "queued delivery=%s event=%s action=%s",
        delivery.delivery_id,
        delivery.event,
        delivery.action,
    )
    return QUEUED


def not_kept(delivery: Keep, exc: Exception) -> Answer:
    log.error(
        "redis unavailable, delivery=%s event=%s not queued: %s",
        delivery.delivery_id,
        delivery.event,
        exc,
    )
    return UNAVAILABLE


def too_large(limit: int) -> Answer:
    return 413, {"error": f"body over the {limit}-byte limit (GPUCI_MAX_BODY_BYTES)"}


def count_delivery(conn: Redis, event: str, outcome: str) -> None:
    """Count an answered delivery for /metrics; counting never fails the request."""
    try:
        conn.hincrby(keys.webhook_counts(), f"{event or '-'}:{outcome}", 1)
    except RedisError as exc:
        log.warning("cannot count delivery (%s:%s): %s", event, outcome, exc)


def encode_answer(answer: Answer) -> bytes:
    return json.dumps(answer[1]).encode() + b"\n"


class Intake:
    """WSGI middleware: `POST /webhook` answered here, everything else passed to `app`."""

    def __init__(self, app: WSGIApplication, settings: Settings, conn: Redis) -> None:
        self.app, self.settings, self.conn = app, settings, conn
        self.inbox = Inbox(conn)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            return _respond(start_response, NOT_POST, NOT_POST_HEADERS)
        try:
            body = get_input_stream(environ, max_content_length=self.settings.max_body_bytes).read()
            answer = self.receive(body, EnvironHeaders(environ))
        except RequestEntityTooLarge:
            answer = too_large(self.settings.max_body_bytes)
        except ClientDisconnected:
            answer = (400, {"error": "the body ended before its Content-Length"})
        except Exception:
            log.exception("unexpected error receiving a delivery")
            answer = (500, {"error": "internal error; see the gpuci web log"})
        return _respond(start_response, answer)

    def receive(self, body: bytes, headers: Headers) -> Answer:
        """Verify, deduplicate and keep one delivery: (HTTP status, JSON body)."""
        verdict = triage(self.settings.webhook_secret, body, headers)
        if isinstance(verdict, Reply):
            count_delivery(self.conn, verdict.event, verdict.outcome)
            return verdict.answer
        try:
            outcome = self.inbox.accept(verdict.event, verdict.delivery_id, verdict.body)
        except RedisError as exc:
            count_delivery(self.conn, verdict.event, "unavailable")
            return not_kept(verdict, exc)
        return kept(verdict, outcome)


class AsyncIntake:
    """`receive` for an asyncio server (bot/server.py), on one pipelined Redis connection
    (bot/redis_pipe.py): the commands of the deliveries in flight reach Redis together, and
    each delivery is answered after its own reply.

    The commands are `Inbox.accept`'s Lua script (sent with EVAL, so a restarted Redis needs
    no SCRIPT LOAD) and `count_delivery`'s HINCRBY."""

    def __init__(self, settings: Settings, redis: RedisPipe) -> None:
        self.settings, self.redis = settings, redis

    @classmethod
    def from_settings(cls, settings: Settings) -> AsyncIntake:
        """With the Flask app's Redis timeout (create_app); call it inside the loop."""
        return cls(settings, RedisPipe(settings.redis_url, timeout_s=2))

    async def receive(self, body: bytes, headers: Headers) -> Answer:
        """Verify, deduplicate and keep one delivery: (HTTP status, JSON body)."""
        verdict = triage(self.settings.webhook_secret, body, headers)
        if isinstance(verdict, Reply):
            self._count(verdict.event, verdict.outcome)
            return verdict.answer
        envelope = Envelope(verdict.event, verdict.delivery_id, time.time(), verdict.body)
        script_keys = accept_keys(verdict.delivery_id, verdict.body)
        try:
            outcome = await self.redis.send(
                "EVAL",
                _ACCEPT,
                len(script_keys),
                *script_keys,
                *accept_args(verdict.event, envelope.encode()),
            )
        except RedisError as exc:
            self._count(verdict.event, "unavailable")
            return not_kept(verdict, exc)
        return kept(verdict, Accepted(outcome))

    def _count(self, event: str, outcome: str) -> None:
        """count_delivery's HINCRBY; the answer does not wait for it."""
        field = f"{event or '-'}:{outcome}"
        self.redis.send("HINCRBY", keys.webhook_counts(), field, 1).add_done_callback(
            lambda reply: _count_failed(field, reply)
        )

    async def close(self) -> None:
        await self.redis.close()


def _count_failed(field: str, reply: asyncio.Future[Any]) -> None:
    if not reply.cancelled() and reply.exception() is not None:
        log.warning("cannot count delivery (%s): %s", field, reply.exception())


def _respond(
    start_response: StartResponse, answer: Answer, extra: list[tuple[str, str]] | None = None
) -> list[bytes]:
    body = encode_answer(answer)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    start_response(f"{answer[0]} {HTTPStatus(answer[0]).phrase}", headers + (extra or []))
    return [body]
