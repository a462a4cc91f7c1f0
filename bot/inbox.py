"""The webhook inbox: deliveries the web process accepted, kept in Redis until they are jobs.

The web process answers a delivery after one Redis call (`accept`): a Lua script that marks the
delivery id as seen, pushes the raw body onto the inbox list and counts it, atomically. Building
the RQ job (parsing, pickling, compressing a 20 KB payload, two transactions) happens in the
events process instead, where `Pump` moves each delivery from the inbox onto `gpuci-events` in
one MULTI/EXEC with its removal, so a delivery is never in neither place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from redis import Redis
from redis.exceptions import RedisError
from rq import Queue, Retry
from rq.job import Job

from contract import keys
from contract.redis_errors import redis_problem

log = logging.getLogger("gpuci.inbox")

EVENTS_QUEUE = "gpuci-events"
HANDLER = "bot.events.handle_delivery"
DELIVERY_TTL_S = 7 * 24 * 3600  # GitHub redelivers for 3 days; remember a week
# A delivery whose handling failed (GitHub 5xx, Redis hiccup) is tried again after these
# delays; handlers are idempotent, so a retry never duplicates a Check Run or a comment.
DELIVERY_RETRY_S = [10, 60, 300]
UNREADABLE_KEPT = 100  # envelopes that cannot be read are kept for a human, newest first

# KEYS: delivery id key, inbox, counts, body key. ARGV: TTL, envelope, "event:queued",
# "event:duplicate", "event:replayed". Returns an `Accepted`. Both keys last the TTL: a replay
# is caught within the window a redelivery is.
_ACCEPT = """
if not redis.call('SET', KEYS[1], 1, 'NX', 'EX', ARGV[1]) then
  redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
  return 0
end
if not redis.call('SET', KEYS[4], 1, 'NX', 'EX', ARGV[1]) then
  redis.call('HINCRBY', KEYS[3], ARGV[5], 1)
  return 2
end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
return 1
"""


class Accepted(IntEnum):
    """What the inbox did with a delivery (the accept script's reply)."""

    DUPLICATE = 0  # its delivery id was seen (GitHub's redelivery): nothing stored
    QUEUED = 1  # new: now in the inbox
    REPLAYED = 2  # a new id but a body already seen (a replay): nothing stored


def body_key(body: bytes) -> str:
    """The Redis key that remembers a delivery body (its SHA-256)."""
    return keys.delivery_body(hashlib.sha256(body).hexdigest())


@dataclass(frozen=True)
class Envelope:
    """One accepted delivery as the inbox holds it: a JSON header line, then the raw body."""

    event: str
    delivery_id: str
    received_at: float
    body: bytes

    def encode(self) -> bytes:
        header = {"event": self.event, "delivery": self.delivery_id, "at": self.received_at}
        return json.dumps(header).encode() + b"\n" + self.body

    @classmethod
    def decode(cls, raw: bytes) -> Envelope:
        """Raises ValueError for anything `encode` did not write."""
        head, sep, body = raw.partition(b"\n")
        header = json.loads(head) if sep else None
        if not isinstance(header, dict):
            raise ValueError("no header line")
        event, delivery, at = header.get("event"), header.get("delivery"), header.get("at")
        if not (isinstance(event, str) and isinstance(delivery, str) and event and delivery):
            raise ValueError("header without event or delivery id")
        return cls(event, delivery, float(at) if isinstance(at, int | float) else 0.0, body)


class Inbox:
    """The web side: `accept` is the only Redis call a queued delivery costs."""

    def __init__(self, conn: Redis) -> None:
        self.conn = conn
        self._accept = conn.register_script(_ACCEPT)

    def accept(self, event: str, delivery_id: str, body: bytes) -> Accepted:
        """What became of the delivery (QUEUED: it is in the inbox). Raises RedisError when
        Redis does not answer (then nothing was stored)."""
        envelope = Envelope(event, delivery_id, time.time(), body).encode()
        reply = self._accept(keys=accept_keys(delivery_id, body), args=accept_args(event, envelope))
        return Accepted(reply)


def accept_keys(delivery_id: str, body: bytes) -> list[str]:
    """KEYS of the accept script."""
    return [keys.delivery(delivery_id), keys.inbox(), keys.webhook_counts(), body_key(body)]


def accept_args(event: str, envelope: bytes) -> list[int | bytes | str]:
    """ARGV of the accept script."""
    outcomes = [f"{event}:{outcome}" for outcome in ("queued", "duplicate", "replayed")]
    return [DELIVERY_TTL_S, envelope, *outcomes]


def enqueue(
    conn: Redis, event: str, delivery_id: str, payload: Any, *, pipeline: Any = None
) -> None:
    """The RQ job that handles one delivery (job id `delivery-<id>`, retried on failure)."""
    Queue(EVENTS_QUEUE, connection=conn).enqueue(
        HANDLER,
        event,
        delivery_id,
        payload,
        job_id=job_id(delivery_id),
        retry=Retry(max=len(DELIVERY_RETRY_S), interval=DELIVERY_RETRY_S),
        pipeline=pipeline,
    )


def job_id(delivery_id: str) -> str:
    return f"delivery-{delivery_id}"


def pending(conn: Redis) -> int:
    """Deliveries accepted but not yet jobs (the inbox and any move in flight)."""
    pipe = conn.pipeline(transaction=False)
    pipe.llen(keys.inbox())
    pipe.llen(keys.inbox_moving())
    return sum(int(n) for n in pipe.execute())


class Pump:
    """The events side: turns inbox envelopes into `gpuci-events` jobs, oldest first.

    `move_one` takes the oldest envelope to a "moving" list (BLMOVE) and then, in one
    transaction, enqueues its job and drops it from that list. A pump that dies in between
    leaves the envelope on the moving list; `recover` (at start) enqueues what is there unless
    its job already exists. Several pumps may run; at worst a delivery is handled twice, which
    the handlers' idempotence makes harmless."""

    def __init__(self, conn: Redis) -> None:
        self.conn = conn

    def move_one(self, block_s: int = 0) -> bool:
        """Move the oldest delivery; wait up to `block_s` for one (0: don't wait). False when
        the inbox stayed empty."""
        inbox, moving = keys.inbox(), keys.inbox_moving()
        if block_s > 0:
            raw: bytes | None = self.conn.blmove(inbox, moving, block_s, "RIGHT", "LEFT")  # type: ignore[assignment]
        else:
            raw = self.conn.lmove(inbox, moving, "RIGHT", "LEFT")  # type: ignore[assignment]
        if raw is None:
            return False
        self._finish(raw)
        return True

    def drain(self) -> int:
        """Move every delivery in the inbox now; the number moved."""
        moved = 0
        while self.move_one():
            moved += 1
        return moved

    def recover(self) -> int:
        """Finish the moves a dead pump left half done; the number enqueued again."""
        again = 0
        raws: list[bytes] = self.conn.lrange(keys.inbox_moving(), 0, -1)  # type: ignore[assignment]
        for raw in raws:
            try:
                envelope = Envelope.decode(raw)
            except ValueError:
                self._finish(raw)
                continue
            if Job.exists(job_id(envelope.delivery_id), connection=self.conn):
                self.conn.lrem(keys.inbox_moving(), 1, raw)  # type: ignore[arg-type]
            else:
                self._finish(raw)
                again += 1
        return again

    def _finish(self, raw: bytes) -> None:
        """Enqueue the envelope's job and forget the envelope, in one transaction; an envelope
        that cannot be read is set aside on the unreadable list instead."""
        pipe = self.conn.pipeline(transaction=True)
        try:
            envelope = Envelope.decode(raw)
            payload = json.loads(envelope.body)
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ones
            log.error("unreadable inbox entry set aside on %s: %s", keys.inbox_unreadable(), exc)
            pipe.lpush(keys.inbox_unreadable(), raw)
            pipe.ltrim(keys.inbox_unreadable(), 0, UNREADABLE_KEPT - 1)
        else:
            enqueue(self.conn, envelope.event, envelope.delivery_id, payload, pipeline=pipe)
        pipe.lrem(keys.inbox_moving(), 1, raw)  # type: ignore[arg-type]
        pipe.execute()


def pump_forever(conn: Redis, stop: threading.Event, *, block_s: int = 1) -> None:
    """The events process's pump thread: move deliveries until `stop` is set, riding out Redis
    outages with a growing pause (logged once per outage)."""
    pump = Pump(conn)
    pause, recovered, down_since = 0.5, False, 0.0
    while not stop.is_set():
        try:
            if not recovered:
                again = pump.recover()
                if again:
                    log.warning(
                        "re-enqueued %d delivery(ies) a stopped pump left half moved", again
                    )
                recovered = True
            pump.move_one(block_s)
            if down_since:
                log.info(
                    "Redis answers again after %.0f s; moving deliveries", time.time() - down_since
                )
                down_since, pause = 0.0, 0.5
        except RedisError as exc:
            if not down_since:
                down_since = time.time()
                log.error("Redis %s; retrying, inbox deliveries wait there", redis_problem(exc))
            stop.wait(pause)
            pause = min(pause * 2, 10.0)


def start_pump(conn: Redis) -> tuple[threading.Thread, threading.Event]:
    """Run `pump_forever` on a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(
        target=pump_forever, args=(conn, stop), name="gpuci-inbox-pump", daemon=True
    )
    thread.start()
    return thread, stop
