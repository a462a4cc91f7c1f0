"""Two schedulers are safe: one leads under a fenced lock, the other takes over when it dies or
stalls, and a leader that lost the lock writes no lease, assignment or ticket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from app import create_app
from bot import leader, runs, scheduler
from bot.leader import Dispatched, Leadership
from bot.runs import Run, RunState, RunTrigger
from contract import keys, leases
from contract.hostlink import Ticket
from contract.settings import Settings
from tests.conftest import SAMPLE_REPO, db_claim_fd
from tests.test_scheduler import HOST, settings  # noqa: F401  (settings is a fixture)
from workers.gpus import open_backend
from workers.host import publish_host

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (SAMPLE_REPO / ".gpuci.yml").read_text()
LOCK_TTL_S = 3.0
TAKEOVER_S = LOCK_TTL_S + scheduler.TICK_S + 2.0  # TTL, one standby poll, a round's slack


@pytest.fixture
def host(redis_conn: Redis, settings: Settings) -> Iterator[None]:  # noqa: F811
    """An 8-GPU sim host whose heartbeat keeps beating (nobody takes its tickets)."""
    redis_conn.hset(keys.repos(), "acme/sample", "1")
    backend = open_backend(settings.gpu_backend)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            publish_host(redis_conn, settings, backend, slots=16)
            stop.wait(1.0)

    thread = threading.Thread(target=beat, daemon=True)
    publish_host(redis_conn, settings, backend, slots=16)
    thread.start()
    yield
    stop.set()
    thread.join()


def pending(conn: Redis) -> Run:
    return runs.create_run(
        conn,
        repo="acme/sample",
        installation_id=1,
        pr=7,
        sha="c" * 40,
        batch="1",
        trigger=RunTrigger.PULL_REQUEST,
        requested_by="maya",
        config_text=CONFIG,
        trust="trusted",
    )


def wait_for(what: Callable[[], bool], within_s: float, why: str) -> float:
    """Seconds until `what()` held; fails the test past `within_s`."""
    start = time.monotonic()
    while not what():
        if time.monotonic() - start > within_s:
            pytest.fail(f"not within {within_s} s: {why}")
        time.sleep(0.05)
    return time.monotonic() - start


def leader_name(conn: Redis) -> str:
    return leader.leader_view(conn, time.time()).leader


def tickets(conn: Redis) -> list[Ticket]:
    return [Ticket.from_json(raw) for raw in conn.lrange(keys.host_tickets(HOST), 0, -1)]


def assert_each_run_and_gpu_given_once(conn: Redis, expected_runs: list[Run]) -> None:
    """Every run dispatched exactly once, on GPUs no other run got, leased to that very run."""
    given = tickets(conn)
    assert sorted(t.run_id for t in given) == sorted(r.run_id for r in expected_runs)
    gpus = [i for t in given for i in t.gpu_indices]
    assert len(gpus) == len(set(gpus)), f"a GPU leased twice: {sorted(gpus)}"
    holders = leases.holders(conn, HOST, range(8))
    for ticket in given:
        run = runs.get_run(conn, ticket.run_id)
        assert run is not None and run.state is RunState.ASSIGNED
        assert (run.lease_owner, run.gpus) == (ticket.lease_owner, ticket.gpu_indices)
        assert all(holders[i] == ticket.lease_owner for i in ticket.gpu_indices)


class Schedulers:
    """Real scheduler processes (tests/scheduler_process.py) against the test's database."""

    def __init__(self, redis_url: str, logs: Path):
        self.redis_url, self.logs = redis_url, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, holder: str, slow_token_s: float = 0.0) -> None:
        """One scheduler; it stops when its stdin (a pipe from this process) closes, and it
        holds this process's database claim, so none outlives the session unnoticed."""
        command = [sys.executable, "-m", "tests.scheduler_process", self.redis_url, holder]
        with (self.logs / f"{holder}.log").open("wb") as log:
            self.procs[holder] = subprocess.Popen(
                [*command, str(LOCK_TTL_S), str(slow_token_s)],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                pass_fds=(db_claim_fd(),),
            )

    def signal(self, holder: str, sig: int) -> None:
        os.kill(self.procs[holder].pid, sig)

    def log(self, holder: str) -> str:
        return (self.logs / f"{holder}.log").read_text()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:  # one a test stopped has gone already
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()


@pytest.fixture
def schedulers(redis_url: str, tmp_path: Path) -> Iterator[Schedulers]:
    started = Schedulers(redis_url, tmp_path)
    yield started
    started.stop_all()


def start_a_then_b(conn: Redis, schedulers: Schedulers, slow_token_s: float = 0.0) -> None:
    schedulers.start("a", slow_token_s)
    wait_for(lambda: leader_name(conn) == "a", 20, "scheduler a leads")
    schedulers.start("b")
    wait_for(lambda: "b" in leader.leader_view(conn, time.time()).standby, 20, "b stands by")


# --- the lock itself -----------------------------------------------------------------------


def test_one_holds_the_lock_and_renews_it_others_stand_by(redis_conn: Redis) -> None:
    first, second = Leadership(redis_conn, "a", 5), Leadership(redis_conn, "b", 5)
    fence = first.hold(time.time())
    assert fence is not None and fence.holder == "a"
    assert second.hold(time.time()) is None
    assert first.hold(time.time()) == fence  # renewed, same term
    view = leader.leader_view(redis_conn, time.time())
    assert (view.leader, view.term, view.standby) == ("a", fence.term, ("b",))
    assert view.expires_in_s is not None and 0 < view.expires_in_s <= 5


def test_a_lapsed_lock_goes_to_the_next_with_a_new_term(redis_conn: Redis) -> None:
    first, second = Leadership(redis_conn, "a", 0.2), Leadership(redis_conn, "b", 5)
    old = first.hold(time.time())
    assert old is not None
    time.sleep(0.3)  # a stalled leader's lock runs out
    new = second.hold(time.time())
    assert new is not None and new.term == old.term + 1
    assert first.hold(time.time()) is None  # the old leader now stands by
    assert not leader.still_leads(redis_conn, old) and leader.still_leads(redis_conn, new)


def test_resigning_frees_the_lock_at_once(redis_conn: Redis) -> None:
    first, second = Leadership(redis_conn, "a", 30), Leadership(redis_conn, "b", 30)
    assert first.hold(time.time()) is not None
    first.resign()
    fence = second.hold(time.time())
    assert fence is not None and fence.holder == "b"


def test_a_stale_fence_writes_no_lease_assignment_or_ticket(redis_conn: Redis, host: None) -> None:
    """The step a paused leader would take on waking, after it planned with the old lock."""
    stale = Leadership(redis_conn, "a", 0.2).hold(time.time())
    time.sleep(0.3)
    assert Leadership(redis_conn, "b", 30).hold(time.time()) is not None
    run = pending(redis_conn)
    fields = runs.changed_fields(run, state=RunState.ASSIGNED, host=HOST, gpus=(0,))
    sent = leader.dispatch(
        redis_conn, stale, run_id=run.run_id, host=HOST, indices=[0], owner="x:1",
        lease_ttl_s=60, fields=fields, ticket="{}",
    )  # fmt: skip
    assert sent is Dispatched.NOT_LEADING
    assert leases.holders(redis_conn, HOST, [0]) == {0: None}
    assert redis_conn.llen(keys.host_tickets(HOST)) == 0
    still = runs.get_run(redis_conn, run.run_id)
    assert still is not None and still.state is RunState.PENDING
    assert redis_conn.zscore(keys.pending_runs(), run.run_id) is not None


def test_a_round_under_a_lost_lock_does_nothing(redis_conn: Redis, host: None) -> None:
    stale = Leadership(redis_conn, "a", 0.2)
    assert stale.hold(time.time()) is not None
    time.sleep(0.3)
    current = Leadership(redis_conn, "b", 30)
    assert current.hold(time.time()) is not None
    run = pending(redis_conn)
    done = scheduler.tick(redis_conn, lambda r: "t", "http://x", leadership=stale)
    assert done.dispatched == [] and redis_conn.llen(keys.host_tickets(HOST)) == 0
    assert stale.fence is None  # it found the lock gone
    done = scheduler.tick(redis_conn, lambda r: "t", "http://x", leadership=current)
    assert done.dispatched == [run.run_id]


def test_a_long_round_renews_the_lock_as_it_goes(redis_conn: Redis, host: None) -> None:
    """Minting tokens can be slow (a new repository each): the round keeps the lock while it
    makes progress, instead of letting it lapse and a standby start over."""
    leading = Leadership(redis_conn, "a", 0.6)
    fence = leading.hold(time.time())
    made = [pending(redis_conn) for _ in range(4)]

    def slow_token(run: Run) -> str:
        time.sleep(0.25)  # four of these outlast the lock's 0.6 s
        return "t"

    done = scheduler.tick(redis_conn, slow_token, "http://x", leadership=leading)
    assert sorted(done.dispatched) == sorted(r.run_id for r in made)
    assert leading.fence == fence and leader.still_leads(redis_conn, fence)


@pytest.mark.parametrize(
    ("state", "leased", "expected"),
    [
        (RunState.CANCELLED, False, Dispatched.NOT_PENDING),
        (RunState.PENDING, True, Dispatched.LEASED),
        (RunState.PENDING, False, Dispatched.DISPATCHED),
    ],
)
def test_dispatch_is_all_or_nothing(
    redis_conn: Redis, host: None, state: RunState, leased: bool, expected: Dispatched
) -> None:
    fence = Leadership(redis_conn, "a", 30).hold(time.time())
    run = runs.update_run(redis_conn, pending(redis_conn), state=state)
    if leased:
        assert leases.acquire(redis_conn, HOST, [1], "other:1", 60)
    fields = runs.changed_fields(run, state=RunState.ASSIGNED, host=HOST, gpus=(0, 1))
    sent = leader.dispatch(
        redis_conn, fence, run_id=run.run_id, host=HOST, indices=[0, 1], owner="r:1",
        lease_ttl_s=60, fields=fields, ticket="{}",
    )  # fmt: skip
    assert sent is expected
    written = sent is Dispatched.DISPATCHED
    assert (leases.holders(redis_conn, HOST, [0])[0] == "r:1") is written
    assert redis_conn.llen(keys.host_tickets(HOST)) == int(written)
    after = runs.get_run(redis_conn, run.run_id)
    assert after is not None
    assert after.state is (RunState.ASSIGNED if written else state)
    assert redis_conn.sismember(keys.dispatched_runs(), run.run_id) == written


# --- who leads, as operators see it --------------------------------------------------------


def test_healthz_and_the_dashboard_name_the_leader_and_the_standby(
    redis_conn: Redis, redis_url: str
) -> None:
    client = create_app(Settings(redis_url=redis_url, webhook_secret="s"), redis_conn).test_client()
    assert client.get("/healthz").get_json()["leader"] == {
        "scheduler": None, "term": 0, "lock_expires_in_s": None, "standby": [],
    }  # fmt: skip
    fence = Leadership(redis_conn, "sched-a", 10).hold(time.time())
    Leadership(redis_conn, "sched-b", 10).hold(time.time())
    shown = client.get("/healthz").get_json()["leader"]
    assert fence is not None
    assert (shown["scheduler"], shown["term"], shown["standby"]) == (
        "sched-a",
        fence.term,
        ["sched-b"],
    )
    assert 0 < shown["lock_expires_in_s"] <= 10
    page = client.get("/").get_data(as_text=True)
    assert f"leader sched-a (term {fence.term}), standing by: sched-b" in page


# --- two real scheduler processes ----------------------------------------------------------


def test_standby_takes_over_when_the_leader_is_killed(
    redis_conn: Redis, host: None, schedulers: Schedulers
) -> None:
    start_a_then_b(redis_conn, schedulers)
    made = [pending(redis_conn) for _ in range(4)]
    wait_for(lambda: len(tickets(redis_conn)) == 4, 20, "a dispatches the first four")
    schedulers.signal("a", signal.SIGKILL)
    made += [pending(redis_conn) for _ in range(4)]
    took = wait_for(lambda: leader_name(redis_conn) == "b", TAKEOVER_S, "b leads after a died")
    wait_for(lambda: len(tickets(redis_conn)) == 8, 20, "b dispatches the next four")
    assert took <= TAKEOVER_S
    assert_each_run_and_gpu_given_once(redis_conn, made)
    assert "scheduler b leads (term 2)" in schedulers.log("b")


def test_sigterm_hands_the_lock_over_at_once(
    redis_conn: Redis, host: None, schedulers: Schedulers
) -> None:
    """systemd stops a scheduler with SIGTERM: it resigns, and the standby leads within a
    tick or two rather than the lock's TTL."""
    start_a_then_b(redis_conn, schedulers)
    schedulers.signal("a", signal.SIGTERM)
    assert schedulers.procs["a"].wait(timeout=10) == 0
    assert leader_name(redis_conn) != "a"  # resigned on its way out, not left to lapse
    wait_for(lambda: leader_name(redis_conn) == "b", TAKEOVER_S, "b leads after a stopped")
    made = [pending(redis_conn) for _ in range(2)]
    wait_for(lambda: len(tickets(redis_conn)) == 2, 20, "b dispatches")
    assert_each_run_and_gpu_given_once(redis_conn, made)


def test_a_stopped_leader_is_replaced_and_stands_by_when_it_resumes(
    redis_conn: Redis, host: None, schedulers: Schedulers
) -> None:
    start_a_then_b(redis_conn, schedulers)
    made = [pending(redis_conn) for _ in range(2)]
    wait_for(lambda: len(tickets(redis_conn)) == 2, 20, "a dispatches the first two")
    schedulers.signal("a", signal.SIGSTOP)
    wait_for(lambda: leader_name(redis_conn) == "b", TAKEOVER_S, "b leads while a is stopped")
    made += [pending(redis_conn) for _ in range(2)]
    wait_for(lambda: len(tickets(redis_conn)) == 4, 20, "b dispatches while a is stopped")
    schedulers.signal("a", signal.SIGCONT)
    wait_for(lambda: "scheduler a stands by" in schedulers.log("a"), 20, "a stands by")
    made += [pending(redis_conn) for _ in range(2)]
    wait_for(lambda: len(tickets(redis_conn)) == 6, 20, "scheduling goes on")
    assert leader_name(redis_conn) == "b"
    assert_each_run_and_gpu_given_once(redis_conn, made)


def test_a_leader_stalled_mid_round_past_its_lock_writes_nothing(
    redis_conn: Redis, host: None, schedulers: Schedulers
) -> None:
    """a plans the run, then waits on GitHub for longer than its lock lives; b takes over and
    dispatches the run; when a gets its token, Redis refuses its dispatch."""
    start_a_then_b(redis_conn, schedulers, slow_token_s=LOCK_TTL_S + 3 * scheduler.TICK_S)
    made = [pending(redis_conn)]
    wait_for(lambda: leader_name(redis_conn) == "b", TAKEOVER_S + 2, "b leads while a stalls")
    wait_for(lambda: len(tickets(redis_conn)) == 1, 20, "b dispatches the run")
    wait_for(
        lambda: "another scheduler leads now" in schedulers.log("a"), 20, "a's dispatch refused"
    )
    made += [pending(redis_conn)]
    wait_for(lambda: len(tickets(redis_conn)) == 2, 20, "scheduling goes on")
    assert_each_run_and_gpu_given_once(redis_conn, made)
    assert tickets(redis_conn)[-1].source_token == f"token-for-{made[0].run_id}"  # b's own
