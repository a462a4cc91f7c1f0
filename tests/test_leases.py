"""GPU leases against a real Redis: all-or-none, owner checks, TTL, heartbeat, a killed worker."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from contract import keys
from contract.leases import (
    LeaseHeartbeat,
    acquire,
    holders,
    new_owner,
    release,
    renew,
    run_of,
)
from tests.conftest import ROOT

HOST = "h20-01"


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_acquire_takes_all_gpus_for_the_owner(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=30)
    assert holders(redis_conn, HOST, [0, 1, 2]) == {0: "run-a", 1: "run-a", 2: None}
    assert 29_000 < redis_conn.pttl(keys.gpu_lease(HOST, 0)) <= 30_000


def test_overlapping_request_gets_nothing(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [2, 3], "run-a", ttl_s=30)
    assert not acquire(redis_conn, HOST, [0, 1, 2], "run-b", ttl_s=30)
    assert holders(redis_conn, HOST, [0, 1, 2, 3]) == {0: None, 1: None, 2: "run-a", 3: "run-a"}


def test_leases_are_per_host(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0], "run-a", ttl_s=30)
    assert acquire(redis_conn, "h20-02", [0], "run-b", ttl_s=30)


def test_same_owner_may_acquire_again(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0], "run-a", ttl_s=30)
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=30)
    assert holders(redis_conn, HOST, [0, 1]) == {0: "run-a", 1: "run-a"}


def test_renew_extends_only_the_owners_lease(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=1)
    assert not renew(redis_conn, HOST, [0, 1], "run-b", ttl_s=60)
    assert redis_conn.pttl(keys.gpu_lease(HOST, 0)) <= 1000
    assert renew(redis_conn, HOST, [0, 1], "run-a", ttl_s=60)
    assert redis_conn.pttl(keys.gpu_lease(HOST, 1)) > 59_000


def test_renew_fails_if_any_gpu_is_no_longer_ours(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=1)
    redis_conn.delete(keys.gpu_lease(HOST, 1))
    assert not renew(redis_conn, HOST, [0, 1], "run-a", ttl_s=60)
    assert redis_conn.pttl(keys.gpu_lease(HOST, 0)) <= 1000


def test_release_drops_only_what_the_owner_holds(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=30)
    assert acquire(redis_conn, HOST, [2], "run-b", ttl_s=30)
    assert release(redis_conn, HOST, [0, 1, 2], "run-b") == 1
    assert release(redis_conn, HOST, [0, 1, 2], "run-c") == 0
    assert holders(redis_conn, HOST, [0, 1, 2]) == {0: "run-a", 1: "run-a", 2: None}
    assert release(redis_conn, HOST, [0, 1, 2], "run-a") == 2
    assert holders(redis_conn, HOST, [0, 1, 2]) == {0: None, 1: None, 2: None}


def test_lease_expires_after_its_ttl(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0], "run-a", ttl_s=0.2)
    assert not acquire(redis_conn, HOST, [0], "run-b", ttl_s=30)
    assert wait_for(lambda: acquire(redis_conn, HOST, [0], "run-b", ttl_s=30), timeout_s=2)
    assert holders(redis_conn, HOST, [0]) == {0: "run-b"}


def test_ttl_must_be_positive(redis_conn: Redis) -> None:
    with pytest.raises(ValueError, match="TTL must be positive"):
        acquire(redis_conn, HOST, [0], "run-a", ttl_s=0)


def test_owner_tokens_are_unique_and_name_the_run() -> None:
    first, second = new_owner("abc123"), new_owner("abc123")
    assert first != second
    assert run_of(first) == run_of(second) == "abc123"


def test_scripts_work_on_a_connection_that_decodes(redis_url: str, redis_conn: Redis) -> None:
    decoding = Redis.from_url(redis_url, decode_responses=True)
    assert acquire(decoding, HOST, [0], "run-a", ttl_s=30)
    assert holders(redis_conn, HOST, [0]) == holders(decoding, HOST, [0]) == {0: "run-a"}
    decoding.close()


def test_simultaneous_overlapping_requests_never_share_a_gpu(redis_conn: Redis) -> None:
    """Eight runs ask at once for GPUs {i, i+1}: winners hold disjoint sets, losers nothing."""
    start = threading.Barrier(8)
    won: dict[str, list[int]] = {}

    def ask(i: int) -> None:
        wanted = [i, (i + 1) % 8]
        start.wait()
        if acquire(redis_conn, HOST, wanted, f"run-{i}", ttl_s=30):
            won[f"run-{i}"] = wanted

    run_threads([threading.Thread(target=ask, args=(i,)) for i in range(8)])
    granted = [gpu for gpus in won.values() for gpu in gpus]
    assert won
    assert len(granted) == len(set(granted))
    assert holders(redis_conn, HOST, range(8)) == {
        gpu: next((owner for owner, gpus in won.items() if gpu in gpus), None) for gpu in range(8)
    }


def test_racing_runs_never_double_allocate(redis_conn: Redis) -> None:
    """Eight threads repeatedly lease random overlapping GPU sets; no GPU is ever in two runs."""
    in_use: dict[int, str] = {}
    clashes: list[str] = []
    grants = []
    guard = threading.Lock()

    def work(worker: int) -> None:
        rng = random.Random(worker)
        for attempt in range(40):
            owner, wanted = f"w{worker}-{attempt}", rng.sample(range(8), rng.choice([1, 2, 4]))
            if not acquire(redis_conn, HOST, wanted, owner, ttl_s=30):
                continue
            with guard:
                clashes.extend(f"GPU {g}: {in_use[g]} and {owner}" for g in wanted if g in in_use)
                in_use.update(dict.fromkeys(wanted, owner))
                grants.append(owner)
            time.sleep(0.001)
            with guard:
                for gpu in wanted:
                    in_use.pop(gpu)
            assert release(redis_conn, HOST, wanted, owner) == len(wanted)

    run_threads([threading.Thread(target=work, args=(w,)) for w in range(8)])
    assert clashes == []
    assert grants


def run_threads(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)


def test_heartbeat_keeps_the_lease_past_several_ttls(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=0.5)
    with LeaseHeartbeat(redis_conn, HOST, [0, 1], "run-a", ttl_s=0.5) as heartbeat:
        time.sleep(2)
        assert not acquire(redis_conn, HOST, [1], "run-b", ttl_s=30)
        assert holders(redis_conn, HOST, [0, 1]) == {0: "run-a", 1: "run-a"}
    assert not heartbeat.lost.is_set()
    assert heartbeat.reason is None


def test_heartbeat_stop_lets_the_lease_expire(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0], "run-a", ttl_s=0.5)
    LeaseHeartbeat(redis_conn, HOST, [0], "run-a", ttl_s=0.5).start().stop()
    assert wait_for(lambda: acquire(redis_conn, HOST, [0], "run-b", ttl_s=30), timeout_s=2)


def test_heartbeat_reports_a_stolen_lease(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [0, 1], "run-a", ttl_s=0.6)
    with LeaseHeartbeat(redis_conn, HOST, [0, 1], "run-a", ttl_s=0.6) as heartbeat:
        redis_conn.set(keys.gpu_lease(HOST, 1), "run-b")
        assert heartbeat.lost.wait(timeout=2)
    assert heartbeat.reason == f"lease on {HOST} lost: GPU 1 now held by run-b"


def test_heartbeat_reports_a_deleted_lease(redis_conn: Redis) -> None:
    assert acquire(redis_conn, HOST, [3], "run-a", ttl_s=0.6)
    with LeaseHeartbeat(redis_conn, HOST, [3], "run-a", ttl_s=0.6) as heartbeat:
        redis_conn.delete(keys.gpu_lease(HOST, 3))
        assert heartbeat.lost.wait(timeout=2)
    assert heartbeat.reason == f"lease on {HOST} lost: GPU 3 expired or released"


def test_heartbeat_reports_loss_when_redis_is_unreachable() -> None:
    unreachable = Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), retries=0))
    with LeaseHeartbeat(unreachable, HOST, [0], "run-a", ttl_s=0.3) as heartbeat:
        assert heartbeat.lost.wait(timeout=3)
    assert heartbeat.reason is not None
    assert heartbeat.reason.startswith(f"lease on {HOST} GPUs [0] not renewed: Redis error:")


def test_heartbeat_survives_one_redis_error(redis_conn: Redis) -> None:
    """A single failed renewal is retried before the lease is declared lost."""
    assert acquire(redis_conn, HOST, [0], "run-a", ttl_s=0.6)
    flaky = FlakyRedis(redis_conn, failures=1)
    with LeaseHeartbeat(flaky, HOST, [0], "run-a", ttl_s=0.6) as heartbeat:
        time.sleep(1.2)
    assert flaky.failed == 1
    assert not heartbeat.lost.is_set()
    assert holders(redis_conn, HOST, [0]) == {0: "run-a"}


class FlakyRedis(Redis):
    """A real connection whose first `failures` script calls raise a connection error."""

    def __init__(self, real: Redis, failures: int) -> None:
        super().__init__(connection_pool=real.connection_pool)
        self.failures, self.failed = failures, 0

    def evalsha(self, *args: object) -> object:
        if self.failed < self.failures:
            self.failed += 1
            raise RedisConnectionError("connection reset by peer")
        return super().evalsha(*args)  # type: ignore[arg-type]


HOLDER = """
import sys, time
from redis import Redis
from contract.leases import LeaseHeartbeat, acquire

conn = Redis.from_url(sys.argv[1])
if not acquire(conn, "h20-01", [0, 1], "killed-run", ttl_s=2):
    sys.exit("could not acquire")
with LeaseHeartbeat(conn, "h20-01", [0, 1], "killed-run", ttl_s=2):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def lease_holder(redis_url: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.mark.slow
def test_sigkilled_worker_loses_its_lease_by_ttl(
    redis_conn: Redis, lease_holder: subprocess.Popen[str]
) -> None:
    assert lease_holder.stdout is not None
    assert lease_holder.stdout.readline().strip() == "held"
    time.sleep(3)  # longer than the TTL: the holder's heartbeat keeps the lease
    assert not acquire(redis_conn, HOST, [1, 2], "other-run", ttl_s=30)

    lease_holder.send_signal(signal.SIGKILL)
    lease_holder.wait(timeout=10)
    killed_at = time.monotonic()
    assert not acquire(redis_conn, HOST, [1, 2], "other-run", ttl_s=30)
    assert wait_for(lambda: acquire(redis_conn, HOST, [1, 2], "other-run", ttl_s=30), 4)
    assert time.monotonic() - killed_at <= 2.5
    assert holders(redis_conn, HOST, [0, 1, 2]) == {0: None, 1: "other-run", 2: "other-run"}
