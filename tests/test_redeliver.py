"""Missed webhooks: deliveries answered 503 while Redis was down are replayed through GitHub's
deliveries API (`bot/redeliver.py`), once, and then handled as if nothing had happened."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from rq import Queue

from bot import cli, runs
from bot.inbox import EVENTS_QUEUE, Pump
from bot.redeliver import deliveries_to_redeliver, redeliver_failed, since_last_check
from bot.timestamps import iso
from contract import keys
from tests.conftest import EVENTS_WORLD
from tests.redis_server import PrivateRedis, private_redis_server, stack_on

T0 = 1_700_000_000.0
OK = ("OK", 202)
DOWN = ("Invalid HTTP Response: 503", 503)
REFUSED = ("failed to connect: [Errno 111] Connection refused", 0)
BAD_SIGNATURE = ("Invalid HTTP Response: 401", 401)


def delivery(
    id_: int, guid: str, at: float, outcome: tuple[str, int], redelivery: bool = False
) -> dict[str, Any]:
    status, code = outcome
    return {
        "id": id_,
        "guid": guid,
        "delivered_at": iso(at),
        "redelivery": redelivery,
        "status": status,
        "status_code": code,
        "event": "pull_request",
        "action": "opened",
    }


SELECTION = [
    pytest.param([delivery(1, "a", T0, DOWN)], set(), ["a"], id="503 is redelivered"),
    pytest.param([delivery(1, "a", T0, REFUSED)], set(), ["a"], id="no answer is redelivered"),
    pytest.param([delivery(1, "a", T0, OK)], set(), [], id="OK is not"),
    pytest.param([delivery(1, "a", T0, BAD_SIGNATURE)], set(), [], id="4xx would fail again"),
    pytest.param([delivery(1, "a", T0 - 10, DOWN)], set(), [], id="before since"),
    pytest.param([delivery(1, "a", T0, DOWN)], {"a"}, [], id="guid seen by the web process"),
    pytest.param(
        [delivery(2, "a", T0 + 5, OK, redelivery=True), delivery(1, "a", T0, DOWN)],
        set(),
        [],
        id="redelivered OK later",
    ),
    pytest.param(
        [delivery(2, "a", T0 + 5, DOWN, redelivery=True), delivery(1, "a", T0, DOWN)],
        set(),
        [2],
        id="redelivery failed too: once, its newest attempt",
    ),
    pytest.param(
        [delivery(2, "a", T0 + 5, DOWN, redelivery=True), delivery(1, "a", T0 - 60, DOWN)],
        set(),
        [2],
        id="old failure retried within since",
    ),
    pytest.param(
        [delivery(3, "c", T0 + 2, DOWN), delivery(2, "b", T0 + 1, OK), delivery(1, "a", T0, DOWN)],
        set(),
        ["a", "c"],
        id="oldest first, others untouched",
    ),
    pytest.param([{**delivery(1, "", T0, DOWN)}], set(), [], id="no guid"),
]


@pytest.mark.parametrize(("deliveries", "seen", "expected"), SELECTION)
def test_deliveries_to_redeliver(
    deliveries: list[dict[str, Any]], seen: set[str], expected: list[Any]
) -> None:
    chosen = deliveries_to_redeliver(deliveries, seen, T0)
    if expected and isinstance(expected[0], int):
        assert [d["id"] for d in chosen] == expected
    else:
        assert [d["guid"] for d in chosen] == expected


def test_timestamps_have_whole_seconds() -> None:
    """GitHub's `delivered_at` drops the fraction: a delivery in the second `since` falls in
    counts."""
    assert deliveries_to_redeliver([delivery(1, "a", T0, DOWN)], set(), T0 + 0.5) != []
    assert deliveries_to_redeliver([delivery(1, "a", T0, DOWN)], set(), T0 + 1) == []


def test_since_last_check(redis_conn: Redis) -> None:
    assert since_last_check(redis_conn, now=T0) == T0 - 3600
    redis_conn.set(keys.redeliver_checked(), str(T0 - 60))
    assert since_last_check(redis_conn, now=T0) == T0 - 60 - 300
    redis_conn.set(keys.redeliver_checked(), str(T0 - 10 * 24 * 3600))
    assert since_last_check(redis_conn, now=T0) == T0 - 3 * 24 * 3600


# --- end to end: Redis restarts while a PR is opened -----------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    with private_redis_server(tmp_path / "redis") as server:
        yield server


def test_a_pr_opened_while_redis_was_down_is_redelivered_once(
    private_redis: PrivateRedis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    since = time.time() - 60
    with stack_on(private_redis, EVENTS_WORLD, tmp_path, monkeypatch) as (stack, app):
        private_redis.stop()
        opened = stack.control(
            "POST",
            "pulls",
            {"repo": "acme/gpu", "author": "alice", "head": {"ref": "feature", "repo": "acme/gpu"}},
        )
        missed, sha = opened["delivery"], opened["pull"]["head_sha"]
        assert missed["status_code"] == 503, missed
        recorded = {d["guid"]: d for d in stack.state()["deliveries"]}
        assert recorded[missed["guid"]]["status_code"] == 503

        private_redis.start()
        assert redeliver_failed(app, stack.redis, since) == [missed["guid"]]
        attempts = [d for d in stack.state()["deliveries"] if d["guid"] == missed["guid"]]
        assert [(d["redelivery"], d["status_code"]) for d in attempts] == [
            (False, 503),
            (True, 202),
        ]
        assert stack.redis.exists(keys.delivery(missed["guid"]))
        assert Pump(stack.redis).drain() == 1
        queue = Queue(EVENTS_QUEUE, connection=stack.redis)
        assert queue.job_ids == [f"delivery-{missed['guid']}"]
        assert stack.redis.get(keys.redeliver_checked()) is not None

        stack.process()
        checks = stack.checks(sha)
        assert sorted(checks) == ["gpuci / batch 2", "gpuci / batch 5"]
        assert {c["status"] for c in checks.values()} == {"queued"}
        assert len(runs.pending_runs(stack.redis)) == 2

        assert redeliver_failed(app, stack.redis, since) == []
        assert len(stack.state()["deliveries"]) == len(recorded) + 1

        assert cli.main(["redeliver", "--since", "5"]) == 0  # the CLI: nothing left to send
        assert capsys.readouterr().err.strip().endswith("redelivered 0 deliveries")


def test_the_scheduler_checks_once_a_minute_and_survives_failures(
    redis_conn: Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from bot import scheduler

    monkeypatch.setattr(scheduler, "TICK_S", 0.0)
    minutes = iter(["2026-01-01T10:00:05", "2026-01-01T10:00:40", "2026-01-01T10:01:00"] * 2)

    class Clock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Clock:
            return cls.fromisoformat(next(minutes)).replace(tzinfo=UTC)

    monkeypatch.setattr(scheduler, "datetime", Clock)
    calls: list[int] = []

    def broken() -> list[str]:
        calls.append(1)
        raise RuntimeError("GitHub is down")

    rounds = iter(range(3))
    scheduler.main_loop(
        redis_conn, lambda run: "", "http://api", lambda: next(rounds, None) is None, None, broken
    )
    assert calls == [1, 1]  # rounds at 10:00:05, 10:00:40 and 10:01:00: two checks
    assert "checking for missed webhook deliveries failed" in caplog.text
