"""Redis restarted mid-run: a real `gpuci worker`, `gpuci scheduler` and `gpuci events` ride out
the outage, reconnect, and every run ends with its true result on GitHub, once. Redis runs with
the persistence production uses (deploy/redis-persistence.conf) and is stopped as systemd does."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any, cast

import pytest
from redis import Redis
from rq import Queue
from rq.registry import FailedJobRegistry

from bot import runs, scheduler
from bot.github_app import GitHubApp
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, load_result
from contract import keys, leases
from contract.settings import Settings
from tests.conftest import SAMPLE_REPO, Stack
from tests.redis_server import PrivateRedis, private_redis_server, stack_on
from tests.test_cli import SAMPLE_OUTCOMES
from workers.host import Host

HOST = "sim-h20-01"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    with private_redis_server(tmp_path / "redis", persistent=True) as server:
        yield server


def restart_when(
    server: PrivateRedis, ready: Callable[[], bool], outage_s: float
) -> Callable[[], None]:
    """Stop the server once `ready()`, start it again `outage_s` later, in a thread; the
    returned function waits for that and fails the test if it went wrong."""
    failed: list[BaseException] = []

    def restart() -> None:
        try:
            deadline = time.monotonic() + 15
            while not ready():
                assert time.monotonic() < deadline, "never ready for the restart"
                time.sleep(0.02)
            server.stop()
            time.sleep(outage_s)
            server.start()
        except BaseException as exc:  # reported by the returned function
            failed.append(exc)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()

    def done() -> None:
        thread.join(timeout=30)
        assert not thread.is_alive() and not failed, failed

    return done


# --- the pieces: the GPU lease heartbeat, the host's RQ worker, the scheduler ----------------


@pytest.mark.parametrize(
    ("outage_s", "kept"),
    [pytest.param(1.5, True, id="shorter than the TTL"), pytest.param(4.0, False, id="longer")],
)
def test_a_lease_heartbeat_rides_out_a_restart_shorter_than_the_lease(
    redis_server: PrivateRedis, outage_s: float, kept: bool
) -> None:
    """TTL 3 s, renewed every second: the lease outlives a shorter outage, and is lost (in
    Redis too: it expired there) after a longer one."""
    conn = Redis.from_url(redis_server.url)
    assert leases.acquire(conn, HOST, [0, 1], "run-a", ttl_s=3)
    with leases.LeaseHeartbeat(conn, HOST, [0, 1], "run-a", ttl_s=3) as heartbeat:
        restart_when(redis_server, lambda: True, outage_s)()
        time.sleep(1.5)  # a renewal or two after Redis is back
    assert heartbeat.lost.is_set() is not kept
    expected = "run-a" if kept else None
    assert leases.holders(conn, HOST, [0, 1]) == {0: expected, 1: expected}
    if not kept:
        assert heartbeat.reason is not None and "no renewal for 3 s" in heartbeat.reason


def test_the_host_loop_keeps_taking_tickets_through_a_restart(
    redis_server: PrivateRedis,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis is down for 2.5 s while the host waits for tickets; the host waits it out and runs
    the next ticket (here one that is not a ticket: its own process drops it)."""
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("GPUCI_HOST", HOST)
    monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
    conn = Redis.from_url(redis_server.url)
    settings = Settings.from_env(dotenv=None)
    host = Host(conn, settings, slots=1)
    caplog.set_level(logging.WARNING, logger="gpuci.worker")
    serving = threading.Thread(target=host.serve)
    serving.start()
    try:
        restart_when(redis_server, lambda: True, 2.5)()
        conn.lpush(keys.host_tickets(HOST), b"not a ticket")
        deadline = time.monotonic() + 30
        while conn.llen(keys.host_tickets(HOST)) or conn.llen(keys.host_taken(HOST)):
            assert time.monotonic() < deadline, "the ticket was not taken after the restart"
            time.sleep(0.1)
        spare = host.spare  # the next run's process, started ahead, waits for its ticket
        assert spare is not None and spare.poll() is None
    finally:
        host.stop()
        serving.join(timeout=30)
    assert not serving.is_alive()
    assert spare.returncode == 0  # told there is no ticket, it left
    assert "taking tickets: Redis unreachable" in caplog.text


def test_the_scheduler_waits_for_redis_with_growing_pauses(
    redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rounds (layer schedules first) fail while Redis is down: the scheduler waits 4, then 5 s
    between them, and is back to a round every 2 s once Redis answers."""
    conn = Redis.from_url(redis_server.url)
    schedules = scheduler.Schedules(conn, cast(GitHubApp, None))  # no repositories: no GitHub
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 4:
            redis_server.start()

    monkeypatch.setattr(scheduler, "time", SimpleNamespace(time=time.time, sleep=sleep))
    caplog.set_level(logging.INFO, logger="gpuci.scheduler")
    redis_server.stop()
    scheduler.main_loop(conn, lambda run: "", "http://api", lambda: len(waits) >= 6, schedules)
    assert waits == [4, 5, 5, 5, 2, 2]
    assert caplog.text.count("Redis unreachable") == 4
    assert "Redis answers again; scheduling resumed" in caplog.text
    assert conn.exists(keys.scheduler_alive())


# --- the whole loop -----------------------------------------------------------------------------


E2E_WORLD = Path(__file__).parent / "data" / "world-e2e.yml"
GATED = {"1": "tests/test_single.py", "2": "tests/test_dist.py"}
# the sample's outcomes plus the gate test, which passes
EXPECTED = {
    "cpu": SAMPLE_OUTCOMES["cpu"][1:],
    "1": ("success", {**SAMPLE_OUTCOMES["1"][2], "passed": 4}),
    "2": ("failure", {**SAMPLE_OUTCOMES["2"][2], "passed": 3}),
}

GATE_TEST = '''

def test_holds_until_the_gate_opens():
    """Added by tests/test_redis_restart.py: says it started, then waits for the test."""
    import pathlib
    import time

    gate = pathlib.Path({gate!r})
    (gate / "started").touch()
    deadline = time.monotonic() + 60
    while not (gate / "open").exists():
        assert time.monotonic() < deadline, "the gate never opened"
        time.sleep(0.05)
'''


@pytest.fixture
def stack(
    redis_server: PrivateRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    with stack_on(redis_server, E2E_WORLD, tmp_path, monkeypatch) as (found, _):
        monkeypatch.setenv("GPUCI_HOST", HOST)
        monkeypatch.setenv("GPUCI_GPU_BACKEND", "sim:8xH20-96GB")
        monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
        monkeypatch.setenv("GPUCI_IDLE_SAMPLE_INTERVAL_S", "0")
        monkeypatch.setenv("GPUCI_KILL_GRACE_S", "1")
        # The gated tests talk to this test through host files, which a sandbox would hide.
        monkeypatch.setenv("GPUCI_SANDBOX", "none")
        # renewed every 5 s: the outage (5.5 to 7 s) fails a renewal; the lease outlives it
        monkeypatch.setenv("GPUCI_LEASE_TTL_S", "15")
        yield found


class Processes:
    """gpuci's long-running processes, each logging to a file the assertions can show."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: list[IO[bytes]] = []

    def start(self, name: str, *args: str) -> None:
        self.logs.mkdir(exist_ok=True)
        out = (self.logs / f"{name}.log").open("wb")
        self.files.append(out)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", name, *args], stdout=out, stderr=subprocess.STDOUT
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def alive(self) -> dict[str, int | None]:
        return {name: proc.poll() for name, proc in self.procs.items()}

    def stop(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait(timeout=10)
        for out in self.files:
            out.close()
        return codes

    def tails(self) -> str:
        return "\n".join(f"--- {n}.log\n{self.log(n)[-3000:]}" for n in self.procs)


@pytest.fixture
def processes(tmp_path: Path, stack: Stack) -> Iterator[Processes]:
    found = Processes(tmp_path / "logs")
    try:
        yield found
    finally:
        found.stop()


def wait_for(condition: Callable[[], bool], what: str, procs: Processes, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{procs.tails()}"
        time.sleep(0.05)


def gated_pr(stack: Stack, gates: Path) -> dict[str, Any]:
    """A trusted PR whose batches 1 and 2 each hold a test until the test opens its gate."""
    files = {}
    for batch, path in GATED.items():
        (gates / batch).mkdir(parents=True)
        original = (SAMPLE_REPO / path).read_text()
        files[path] = original + GATE_TEST.format(gate=str(gates / batch))
    head = {"ref": "gated", "repo": "acme/sample", "files": files}
    body = {"repo": "acme/sample", "author": "maya", "head": head}
    opened = stack.control("POST", "pulls", body)
    assert opened["delivery"]["status_code"] == 202, opened["delivery"]
    return dict(opened["pull"])


def runs_of(stack: Stack, number: int) -> dict[str, Run]:
    return {r.batch: r for r in runs.runs_of_pr(stack.redis, "acme/sample", number)}


def junit_written(work_dir: Path, run_id: str) -> bool:
    return any(work_dir.glob(f"run-{run_id}-*/junit.xml"))


def check_runs(stack: Stack, sha: str) -> dict[str, list[dict[str, Any]]]:
    """Every Check Run at `sha` by name (a name with two would be a duplicate)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for check in stack.state()["check_runs"]:
        if check["head_sha"] == sha:
            found.setdefault(check["fields"]["name"], []).append(check)
    return found


def all_reported(stack: Stack, sha: str) -> bool:
    batches = {n: c for n, c in check_runs(stack, sha).items() if n.startswith("gpuci / batch")}
    return len(batches) == len(EXPECTED) and all(
        c[-1]["fields"]["status"] == "completed" for c in batches.values()
    )


def beat_since(stack: Stack, since: float) -> bool:
    """The host and the scheduler have both written their heartbeat since `since`."""
    host = stack.redis.hget(keys.host(HOST), "heartbeat_at")
    scheduler_at = stack.redis.get(keys.scheduler_alive())
    return all(float(at or 0) > since for at in (host, scheduler_at))


def test_runs_finish_with_their_true_results_across_a_redis_restart(
    stack: Stack, redis_server: PrivateRedis, processes: Processes, tmp_path: Path
) -> None:
    started = time.monotonic()
    for name, args in {
        "worker": ("--host", HOST, "--slots", "4"),
        "scheduler": (),
        "events": (),
    }.items():
        processes.start(name, *args)
    gates, work_dir = tmp_path / "gates", tmp_path / "runs"
    pr = gated_pr(stack, gates)
    sha = pr["head_sha"]

    # both gated batches are running their tests (the cpu batch may be anywhere)
    started_marks = [gates / batch / "started" for batch in GATED]
    wait_for(lambda: all(m.exists() for m in started_marks), "batches 1 and 2", processes, 30)
    before = runs_of(stack, pr["number"])
    assert sorted(before) == sorted(EXPECTED)
    assert all(before[b].state is RunState.RUNNING for b in GATED)

    # Redis stops (as `systemctl restart redis` does: SIGTERM); batch 1 ends during the outage
    redis_server.stop()
    down_at = time.monotonic()
    (gates / "1" / "open").touch()
    wait_for(lambda: junit_written(work_dir, before["1"].run_id), "batch 1's end", processes, 15)
    time.sleep(max(2.0, 5.5 - (time.monotonic() - down_at)))  # its result waits for Redis
    redis_server.start()
    outage_s, back_at = time.monotonic() - down_at, time.time()
    assert processes.alive() == dict.fromkeys(processes.procs), processes.tails()

    # batch 2's lease survived the outage (persisted with its TTL)
    held = leases.holders(stack.redis, HOST, before["2"].gpus)
    assert set(held.values()) == {before["2"].lease_owner}

    # batch 2 ends with Redis back; everything finishes and reaches GitHub
    (gates / "2" / "open").touch()
    wait_for(lambda: all_reported(stack, sha), "completed Check Runs", processes, 30)
    elapsed_s = time.monotonic() - started
    # every process reconnected: the host and the scheduler beat again
    wait_for(lambda: beat_since(stack, back_at), "heartbeats", processes, 10)
    assert processes.alive() == dict.fromkeys(processes.procs), processes.tails()

    after = runs_of(stack, pr["number"])
    for batch, (conclusion, counts) in EXPECTED.items():
        run = after[batch]
        assert run.state is RunState.COMPLETED, (batch, run, processes.tails())
        assert (run.conclusion, run.attempts) == (conclusion, 0), (batch, run.title)
        result = load_result(stack.redis, run.run_id)
        assert result is not None and result["sha"] == sha
        assert {k: result[k] for k in counts} == counts, batch
        [check] = check_runs(stack, sha)[f"gpuci / batch {batch}"]  # one Check Run, no duplicate
        fields = check["fields"]
        assert (fields["status"], fields["conclusion"]) == ("completed", conclusion)
        assert fields["output"]["title"] == result["check_output"]["title"] == run.title
        completions = [h for h in check["history"] if h["request"].get("status") == "completed"]
        assert len(completions) == 1, batch  # the final update was sent once
    assert all(owner is None for owner in leases.holders(stack.redis, HOST, range(8)).values())
    assert runs.dispatched_runs(stack.redis) == []
    for queue_name in (REPORTS_QUEUE,):
        queue = Queue(queue_name, connection=stack.redis)
        assert FailedJobRegistry(queue=queue).get_job_ids() == [], queue_name
    worker_log = processes.log("worker")
    for waited in (f"run={before['1'].run_id} upload JUnit: Redis unreachable", "not renewed"):
        assert waited in worker_log, processes.tails()
    print(f"outage {outage_s:.1f} s, whole run {elapsed_s:.1f} s")
