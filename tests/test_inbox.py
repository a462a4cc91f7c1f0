"""The webhook inbox (bot/inbox.py) against real Redis: accept, move to RQ jobs, recover."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from redis import Redis
from rq import Queue

from bot import inbox
from bot.inbox import Envelope, Inbox, Pump
from contract import keys


def events_queue(conn: Redis) -> Queue:
    return Queue(inbox.EVENTS_QUEUE, connection=conn)


def test_deliveries_become_jobs_oldest_first(redis_conn: Redis) -> None:
    box = Inbox(redis_conn)
    for n in range(3):
        assert box.accept("pull_request", f"d{n}", json.dumps({"number": n}).encode())
    assert not box.accept("pull_request", "d1", b"{}")  # a repeat is not queued again
    assert inbox.pending(redis_conn) == 3
    assert Pump(redis_conn).drain() == 3
    jobs = events_queue(redis_conn).get_jobs()
    assert [job.args for job in jobs] == [
        ("pull_request", f"d{n}", {"number": n}) for n in range(3)
    ]
    assert inbox.pending(redis_conn) == 0
    assert Pump(redis_conn).drain() == 0


def test_the_envelope_keeps_the_raw_body_byte_for_byte() -> None:
    body = '{"title": "ünïcode \\n and a\\nnewline"}\n'.encode()
    decoded = Envelope.decode(Envelope("issue_comment", "x-1", 12.5, body).encode())
    assert decoded == Envelope("issue_comment", "x-1", 12.5, body)


@pytest.mark.parametrize(
    "raw",
    [b"", b"no header", b"[1]\n{}", b'{"event": "pull_request"}\n{}', b'{"delivery": "d"}\n{}'],
)
def test_an_envelope_gpuci_did_not_write_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        Envelope.decode(raw)


def test_unreadable_entries_are_set_aside_not_lost(redis_conn: Redis, caplog) -> None:
    redis_conn.lpush(keys.inbox(), b"garbage", Envelope("pull_request", "d", 1, b"{nope").encode())
    Inbox(redis_conn).accept("pull_request", "good", b"{}")
    with caplog.at_level(logging.ERROR, logger="gpuci.inbox"):
        assert Pump(redis_conn).drain() == 3
    assert [job.id for job in events_queue(redis_conn).get_jobs()] == ["delivery-good"]
    assert redis_conn.llen(keys.inbox_unreadable()) == 2
    assert redis_conn.llen(keys.inbox_moving()) == 0
    assert caplog.text.count("unreadable inbox entry set aside") == 2


def test_a_move_left_half_done_is_finished_once(redis_conn: Redis) -> None:
    """A pump that died between taking an envelope (BLMOVE) and enqueueing its job leaves it on
    the moving list; recovery enqueues it, unless its job was made already."""
    box = Inbox(redis_conn)
    box.accept("pull_request", "lost", b'{"n": 1}')
    box.accept("pull_request", "made", b'{"n": 2}')
    for _ in range(2):
        redis_conn.lmove(keys.inbox(), keys.inbox_moving(), "RIGHT", "LEFT")
    inbox.enqueue(redis_conn, "pull_request", "made", {"n": 2})
    assert Pump(redis_conn).recover() == 1
    assert sorted(job.id for job in events_queue(redis_conn).get_jobs()) == [
        "delivery-lost",
        "delivery-made",
    ]
    assert inbox.pending(redis_conn) == 0


def test_the_pump_thread_moves_deliveries_as_they_arrive(redis_conn: Redis) -> None:
    redis_conn.lpush(keys.inbox_moving(), Envelope("pull_request", "left", 1, b"{}").encode())
    thread, stop = inbox.start_pump(redis_conn)
    try:
        Inbox(redis_conn).accept("check_run", "new", b'{"action": "rerequested"}')
        deadline = time.monotonic() + 10
        while events_queue(redis_conn).count < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(events_queue(redis_conn).get_job_ids()) == ["delivery-left", "delivery-new"]
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_the_pump_rides_out_a_redis_it_cannot_reach(caplog) -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.1)
    stop = threading.Event()
    with caplog.at_level(logging.ERROR, logger="gpuci.inbox"):
        thread = threading.Thread(target=inbox.pump_forever, args=(dead, stop))
        thread.start()
        time.sleep(1.0)  # pauses of 0.5 s, then 1 s: at least two failed tries
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert caplog.text.count("Redis unreachable") == 1  # once per outage, not once per try
