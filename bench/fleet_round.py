"""Benchmark: one whole scheduling round against real Redis, at fleet sizes.

`scheduler.tick` as the leader runs it: read pending runs, hosts, leases and durations from
Redis, plan, lease and dispatch, store wait reasons and queue Check Run updates for the ones
that changed. Hosts are registered as `gpuci worker` does (`publish_host`, 8 simulated H20s
each); about half their GPUs are held by running runs with known durations. Each size is
measured three rounds in a row: the first (every wait reason is new, free GPUs are
dispatched), the second (it reads again the runs the first one wrote) and a steady one
(nothing changed since: what the scheduler does every 2 s while the fleet is full). Redis
round trips are counted on the connection (a pipeline or a script is one).

    .venv/bin/python bench/fleet_round.py [--sizes 10x100,100x1000,500x5000]

It claims a Redis database the way the tests do (never one a test session holds) and
flushes it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.conftest's Redis claim

from bot import leader, runs, scheduler
from bot.runs import RunState, RunTrigger
from contract import keys, leases
from contract.settings import Settings
from tests.conftest import _redis_url
from tests.redis_trips import CountingRedis
from workers.gpus import open_backend
from workers.host import publish_host

CONFIG = """\
version: 1
batches:
  "1": {gpus: 1, tests: [tests], timeout: 10m}
  "2": {gpus: 2, tests: [tests], timeout: 20m}
  "4": {gpus: 4, tests: [tests], timeout: 30m}
  "8": {gpus: 8, tests: [tests], timeout: 40m}
"""
REPOS = [f"org/gpu-{n}" for n in range(20)]
SIZES = "10x100,100x1000,500x5000"


def populate(conn: Redis, hosts: int, pending: int, seed: int = 16) -> None:
    """Hosts with about half their GPUs held by running runs, and `pending` runs waiting."""
    rng = random.Random(seed)
    backend = open_backend("sim:8xH20-96GB")
    for number in range(hosts):
        name = f"h20-{number + 1:03d}"
        settings = Settings(host=name, idle_samples=1, idle_sample_interval_s=0)
        publish_host(conn, settings, backend, slots=8)
        conn.expire(keys.host_alive(name), 3600)
        free = list(range(8))
        while len(free) > 4:
            gpus = rng.choice([g for g in (1, 2, 4) if g <= len(free) - 4] or [1])
            taken, free = free[:gpus], free[gpus:]
            running(conn, rng, name, taken)
    for repo in REPOS:
        for batch in ("1", "2", "4", "8"):
            for _ in range(5):
                runs.record_duration(conn, repo, batch, rng.uniform(60, 1800))
    for _ in range(pending):
        waiting(conn, rng)


def running(conn: Redis, rng: random.Random, host: str, gpus: list[int]) -> None:
    batch = {1: "1", 2: "2", 4: "4"}[len(gpus)]
    run = waiting(conn, rng, batch)
    owner = leases.new_owner(run.run_id)
    assert leases.acquire(conn, host, gpus, owner, 3600)
    runs.update_run(
        conn,
        run,
        state=RunState.RUNNING,
        host=host,
        gpus=tuple(gpus),
        lease_owner=owner,
        started_at=time.time() - rng.uniform(0, 600),
    )


def waiting(conn: Redis, rng: random.Random, batch: str | None = None) -> runs.Run:
    return runs.create_run(
        conn,
        repo=rng.choice(REPOS),
        installation_id=1,
        pr=rng.randint(1, 500),
        sha=f"{rng.getrandbits(160):040x}",
        batch=batch or rng.choice(["1", "1", "2", "4", "8"]),
        trigger=rng.choice([RunTrigger.PULL_REQUEST, RunTrigger.COMMAND, RunTrigger.SCHEDULE]),
        requested_by="bench",
        config_text=CONFIG,
        trust="trusted",
        created_at=time.time() - rng.uniform(0, 3600),
    )


def one_round(
    conn: CountingRedis, leadership: leader.Leadership, cache: runs.RunCache
) -> tuple[float, int, int, int]:
    """Seconds, round trips, runs dispatched and runs waiting, for one leader's round (with
    the run cache the scheduler keeps between its rounds)."""
    before = conn.trips[0]
    start = time.perf_counter()
    done = scheduler.tick(
        conn, lambda run: "token", "http://127.0.0.1:1", leadership=leadership, cache=cache
    )
    took = time.perf_counter() - start
    return took, conn.trips[0] - before, len(done.dispatched), len(done.waiting)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES, help="HOSTSxPENDING, comma-separated")
    args = parser.parse_args()
    url = _redis_url()
    print(f"One scheduling round, Redis {url.rpartition('/')[0]}/<claimed db>, flushed per size")
    head = f"{'hosts':>5} {'pending':>7} {'round':>6} {'time':>9} {'trips':>6} {'sent':>5}"
    print(f"  {head} {'waiting':>7}")
    for size in args.sizes.split(","):
        hosts, pending = (int(n) for n in size.split("x"))
        conn = CountingRedis.from_url(url)
        conn.flushdb()
        populate(conn, hosts, pending)
        conn.hset(keys.repos(), mapping=dict.fromkeys(REPOS, "1"))
        leadership = leader.Leadership(conn, "bench", 600)
        assert leadership.hold(time.time()) is not None
        cache = runs.RunCache()
        for label in ("first", "second", "steady"):
            took, trips, sent, waits = one_round(conn, leadership, cache)
            print(
                f"  {hosts:>5} {pending:>7} {label:>6} {took * 1000:6.0f} ms {trips:>6} "
                f"{sent:>5} {waits:>7}"
            )
        conn.flushdb()


if __name__ == "__main__":
    main()
