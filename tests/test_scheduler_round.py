"""A whole scheduling round against real Redis: pipelined reads, a round-trip count that does
not grow with the number of runs or hosts, and the run cache kept between rounds."""

from __future__ import annotations

import time

import pytest
from redis import Redis

from bot import runs, scheduler
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, RunTrigger
from contract import keys
from contract.settings import Settings
from tests.conftest import SAMPLE_REPO
from tests.redis_trips import CountingRedis
from workers.gpus import open_backend
from workers.host import publish_host

CONFIG = (SAMPLE_REPO / ".gpuci.yml").read_text()


def hosts(conn: Redis, count: int) -> None:
    for number in range(count):
        settings = Settings(host=f"h{number}", idle_samples=1, idle_sample_interval_s=0)
        publish_host(conn, settings, open_backend("sim:8xH20-96GB"), slots=16)
    conn.hset(keys.repos(), "acme/sample", "1")


def pending(conn: Redis, batch: str = "8", pr: int = 7) -> Run:
    return runs.create_run(
        conn,
        repo="acme/sample",
        installation_id=1,
        pr=pr,
        sha="c" * 40,
        batch=batch,
        trigger=RunTrigger.PULL_REQUEST,
        requested_by="maya",
        config_text=CONFIG,
        trust="trusted",
    )


def steady_trips(redis_url: str, host_count: int, run_count: int) -> int:
    """Round trips of a round after the fleet filled up and every wait reason was stored."""
    conn = CountingRedis.from_url(redis_url)
    conn.flushdb()
    hosts(conn, host_count)
    for n in range(run_count):
        pending(conn, pr=n + 1)
    cache = runs.RunCache()
    for _ in range(2):  # dispatch what fits and store reasons; then read again what changed
        scheduler.tick(conn, lambda run: "t", "http://x", cache=cache)
    before = conn.trips[0]
    done = scheduler.tick(conn, lambda run: "t", "http://x", cache=cache)
    assert done.dispatched == [] and len(done.waiting) == run_count - host_count
    return conn.trips[0] - before


def test_round_trips_do_not_grow_with_runs_or_hosts(redis_conn: Redis, redis_url: str) -> None:
    small = steady_trips(redis_url, 1, 10)
    assert steady_trips(redis_url, 1, 300) == small
    assert steady_trips(redis_url, 6, 300) == small
    assert small <= 15


def first_round_trips(redis_url: str, run_count: int) -> tuple[int, int]:
    """Round trips of a first round (every reason new, two runs dispatched), and dispatches."""
    conn = CountingRedis.from_url(redis_url)
    conn.flushdb()
    hosts(conn, 2)
    for n in range(run_count):
        pending(conn, pr=n + 1)
    before = conn.trips[0]
    done = scheduler.tick(conn, lambda run: "t", "http://x", cache=runs.RunCache())
    assert len(done.waiting) == run_count - 2
    return conn.trips[0] - before, len(done.dispatched)


def test_a_first_round_costs_the_same_whatever_the_number_waiting(
    redis_conn: Redis, redis_url: str
) -> None:
    """New reasons for every waiting run are one script and one pipeline of reports."""
    assert first_round_trips(redis_url, 40) == first_round_trips(redis_url, 400)
    assert first_round_trips(redis_url, 40)[1] == 2


def test_wait_reasons_are_stored_and_reported_only_when_they_change(
    redis_conn: Redis, redis_url: str
) -> None:
    hosts(redis_conn, 1)
    made = [pending(redis_conn, pr=n + 1) for n in range(3)]
    cache = runs.RunCache()
    scheduler.tick(redis_conn, lambda run: "t", "http://x", cache=cache)
    reports = redis_conn.llen(f"rq:queue:{REPORTS_QUEUE}")
    waiting = [runs.get_run(redis_conn, r.run_id) for r in made[1:]]
    assert all(w is not None and "position" in w.wait_reason for w in waiting)
    scheduler.tick(redis_conn, lambda run: "t", "http://x", cache=cache)
    assert redis_conn.llen(f"rq:queue:{REPORTS_QUEUE}") == reports  # nothing changed
    runs.cancel_runs(redis_conn, "acme/sample", 2, "closed")
    scheduler.tick(redis_conn, lambda run: "t", "http://x", cache=cache)
    third = runs.get_run(redis_conn, made[2].run_id)
    assert third is not None and "position 1" in third.wait_reason  # moved up: reported
    assert redis_conn.llen(f"rq:queue:{REPORTS_QUEUE}") == reports + 1
    cancelled = runs.get_run(redis_conn, made[1].run_id)
    assert cancelled is not None and cancelled.state is RunState.CANCELLED


def test_a_reason_is_not_written_over_a_run_that_left_pending(redis_conn: Redis) -> None:
    run = pending(redis_conn)
    runs.cancel_runs(redis_conn, "acme/sample", 7, "closed")
    assert runs.set_wait_reasons(redis_conn, {run.run_id: "waiting for 8 idle GPUs"}) == []
    after = runs.get_run(redis_conn, run.run_id)
    assert after is not None and after.state is RunState.CANCELLED
    assert "waiting for 8" not in after.wait_reason


@pytest.mark.parametrize("change", ["transition", "wait reason", "deleted"])
def test_run_cache_reads_again_what_was_written_since(redis_conn: Redis, change: str) -> None:
    cache = runs.RunCache()
    run, other = pending(redis_conn), pending(redis_conn, pr=8)
    assert [r.run_id for r in cache.get_runs(redis_conn, [run.run_id, other.run_id])] == [
        run.run_id,
        other.run_id,
    ]
    time.sleep(0.001)  # a later updated_at
    if change == "transition":
        runs.update_run(redis_conn, run, state=RunState.CANCELLED)
    elif change == "wait reason":
        runs.set_wait_reasons(redis_conn, {run.run_id: "new reason"})
    else:
        redis_conn.delete(keys.run(run.run_id))
    found = {r.run_id: r for r in cache.get_runs(redis_conn, [run.run_id, other.run_id])}
    if change == "deleted":
        assert list(found) == [other.run_id]
    else:
        fresh = runs.get_run(redis_conn, run.run_id)
        assert found[run.run_id] == fresh
    assert found[other.run_id] == other
    assert list(cache.runs) == list(found)  # runs no longer asked for are forgotten
