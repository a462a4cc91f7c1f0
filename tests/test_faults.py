"""Faults on the way: a GPU worker killed mid-run, GitHub failing while gpuci reports, and the
events worker killed while it handles a delivery. Each ends with GitHub showing the truth, once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry

from bot import runs
from bot.inbox import EVENTS_QUEUE, Pump
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, load_result
from contract import keys, leases
from tests.conftest import Stack
from tests.test_cli import SAMPLE_OUTCOMES
from tests.test_e2e import (  # noqa: F401  (loop is a fixture)
    HOST,
    loop,
    register_host,
    schedule,
    state_of,
    wait_for,
)
from workers.host import HOST_TTL_S

LOST = f"worker lost on {HOST}"
CHECKS_PATH = "/repos/acme/sample/check-runs/*"


@pytest.fixture
def world(loop: Stack) -> Stack:  # noqa: F811  (the imported fixture)
    """The e2e world (tests/data/world-e2e.yml) on a simulated 8-GPU host, as in test_e2e."""
    return loop


# --- helpers ---------------------------------------------------------------------------------


def run_of(stack: Stack, number: int, batch: str, sha: str | None = None) -> Run:
    found = [
        r
        for r in runs.runs_of_pr(stack.redis, "acme/sample", number)
        if r.batch == batch and (sha is None or r.sha == sha)
    ]
    assert len(found) == 1, found
    return found[0]


def current(stack: Stack, run_id: str) -> Run:
    run = runs.get_run(stack.redis, run_id)
    assert run is not None
    return run


def check_runs_named(stack: Stack, sha: str, name: str) -> list[dict[str, Any]]:
    """Every Check Run called `name` at `sha` on fakehub (not only the latest)."""
    return [
        c
        for c in stack.state()["check_runs"]
        if c["head_sha"] == sha and c["fields"]["name"] == name
    ]


def fault(stack: Stack, method: str, path: str, status: int, count: int, **extra: Any) -> None:
    body = {"path": path, "method": method, "status": status, "count": count, **extra}
    stack.control("POST", "faults", body)


def marked_pids(marker: str) -> set[int]:
    """Processes (never this one) whose initial environment mentions `marker`: everything the
    test's worker started, whatever its session or process group."""
    needle = marker.encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def kill_all(group: subprocess.Popen[bytes], marker: str) -> None:
    """SIGKILL the process group of `group` and every leftover process carrying `marker`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group.pid, signal.SIGKILL)
    group.wait(timeout=10)
    deadline = time.monotonic() + 10
    while left := marked_pids(marker):
        assert time.monotonic() < deadline, f"processes survive SIGKILL: {left}"
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


# --- 1. a GPU worker SIGKILLed mid-run ---------------------------------------------------------


def test_a_killed_gpu_worker_requeues_its_run_once_then_fails_it(
    world: Stack, tmp_path: Path
) -> None:
    pr = world.open_pr("maya", "slow-gpu", repo="acme/sample")  # batch 1 hangs for 2 minutes
    world.process()
    sha = pr["head_sha"]
    one = run_of(world, pr["number"], "1")
    marker = str(tmp_path / "runs")  # in the environment of every process the worker starts
    worker = start("worker", "--host", HOST, "--slots", "4")
    try:
        wait_for(lambda: bool(world.redis.exists(keys.host_alive(HOST))))
        assert one.run_id in schedule(world).dispatched
        wait_for(lambda: state_of(world, one.run_id) is RunState.RUNNING)
        # the batch's pytest is up (it runs in its own session, with the run's marker)
        wait_for(lambda: any(b"GPUCI_RUN_TOKEN=" in _environ(p) for p in marked_pids(marker)))
        world.process(REPORTS_QUEUE)
        assert check_runs_named(world, sha, "gpuci / batch 1")[0]["fields"]["status"] == (
            "in_progress"
        )
        running = current(world, one.run_id)
        (gpu,) = running.gpus
        assert leases.holders(world.redis, HOST, [gpu])[gpu] == running.lease_owner
    finally:
        kill_all(worker, marker)

    # the run stays running while the host's heartbeat lives; once it expires it is re-queued
    killed_at = time.monotonic()
    alive_s = world.redis.pttl(keys.host_alive(HOST)) / 1000
    assert 0 < alive_s <= HOST_TTL_S
    while one.run_id not in schedule(world).requeued:
        assert time.monotonic() - killed_at < HOST_TTL_S + 5, "never re-queued"
        assert state_of(world, one.run_id) is RunState.RUNNING
        time.sleep(0.25)
    assert time.monotonic() - killed_at > alive_s - 0.5  # not before the heartbeat expired
    assert not world.redis.exists(keys.host_alive(HOST))
    requeued = current(world, one.run_id)
    assert requeued.state is RunState.PENDING
    assert requeued.attempts == 1
    assert f"re-queued: {LOST}" in requeued.wait_reason
    assert requeued.host == "" and requeued.gpus == ()
    assert leases.holders(world.redis, HOST, [gpu])[gpu] is None  # the GPU lease released
    world.process(REPORTS_QUEUE)
    [check] = check_runs_named(world, sha, "gpuci / batch 1")
    assert check["fields"]["status"] == "queued"  # never left in_progress
    assert f"re-queued: {LOST}" in check["fields"]["output"]["summary"]

    # dispatched again; the host is lost again (its heartbeat gone): now the run fails
    register_host(world.redis)
    assert one.run_id in schedule(world).dispatched
    again = current(world, one.run_id)
    assert again.state is RunState.ASSIGNED and again.attempts == 1
    world.redis.delete(keys.host_alive(HOST))
    assert schedule(world).failed.get(one.run_id) == LOST
    failed = current(world, one.run_id)
    assert failed.state is RunState.COMPLETED
    assert (failed.conclusion, failed.title) == ("failure", LOST)
    assert all(owner is None for owner in leases.holders(world.redis, HOST, again.gpus).values())
    world.process(REPORTS_QUEUE)
    [check] = check_runs_named(world, sha, "gpuci / batch 1")
    assert check["fields"]["status"] == "completed"
    assert check["fields"]["conclusion"] == "failure"
    assert check["fields"]["output"]["title"] == LOST


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


# --- 2. GitHub failing while gpuci reports -------------------------------------------------------


def _completed_runs(stack: Stack) -> tuple[dict[str, Any], dict[str, Run]]:
    """A trusted PR whose three batches ran to completion; their reports not yet sent."""
    pr = stack.open_pr("maya", "faster-optimizer", repo="acme/sample")
    stack.process()
    register_host(stack.redis)
    assert len(schedule(stack).dispatched) == 3
    stack.work_host()
    done = {b: current(stack, run_of(stack, pr["number"], b).run_id) for b in ("cpu", "1", "2")}
    assert {r.state for r in done.values()} == {RunState.COMPLETED}
    return pr, done


def test_reports_survive_github_5xx_and_secondary_rate_limits(world: Stack) -> None:
    pr, done = _completed_runs(world)
    fault(world, "PATCH", CHECKS_PATH, 502, 2)
    fault(world, "PATCH", CHECKS_PATH, 403, 1, retry_after=1)
    started = time.monotonic()
    world.process(REPORTS_QUEUE)
    assert time.monotonic() - started < 20
    assert world.state()["faults"] == []  # every fault was met (and retried through)
    reports = Queue(REPORTS_QUEUE, connection=world.redis)
    assert ScheduledJobRegistry(queue=reports).get_job_ids() == []  # nothing left to retry
    sha = pr["head_sha"]
    for batch, run in done.items():
        [check] = check_runs_named(world, sha, f"gpuci / batch {batch}")  # one per batch
        _, conclusion, counts = SAMPLE_OUTCOMES[batch]
        assert check["fields"]["status"] == "completed"
        assert check["fields"]["conclusion"] == conclusion
        result = load_result(world.redis, run.run_id)
        assert result is not None and result["sha"] == sha
        assert {k: result[k] for k in counts} == counts
        assert check["fields"]["output"]["title"] == result["check_output"]["title"]


def _report_outlasting_retries(stack: Stack) -> tuple[dict[str, Any], Run, list[Job]]:
    """GitHub answers 503 (Retry-After: 1) to every update of batch cpu's Check Run for longer
    than the client retries: that report job fails and RQ schedules its retry."""
    pr, done = _completed_runs(stack)
    cpu = done["cpu"]
    assert cpu.check_run_id
    path = f"/repos/acme/sample/check-runs/{cpu.check_run_id}"
    fault(stack, "PATCH", path, 503, 50, retry_after=1)
    reports = Queue(REPORTS_QUEUE, connection=stack.redis)
    started = time.monotonic()
    SimpleWorker([reports], connection=stack.redis).work(burst=True)
    assert time.monotonic() - started < 25
    stack.control("DELETE", "faults")
    scheduled = ScheduledJobRegistry(queue=reports)
    # every report job of the run (queued, in progress, completed) met the faults: each will
    # be retried; the first retry to get through sends the final update, the others find it sent
    jobs = [Job.fetch(job_id, connection=stack.redis) for job_id in scheduled.get_job_ids()]
    assert jobs
    for job in jobs:
        assert job.args == (cpu.run_id,)
        assert job.get_status() == JobStatus.SCHEDULED
        assert job.retries_left == 5  # Retry(max=6): one used
    assert FailedJobRegistry(queue=reports).get_job_ids() == []
    result = load_result(stack.redis, cpu.run_id)  # the result is safe in Redis
    assert result is not None and result["sha"] == pr["head_sha"]
    assert result["check_output"]["title"]
    [check] = check_runs_named(stack, pr["head_sha"], "gpuci / batch cpu")
    assert check["fields"]["status"] != "completed"
    for batch in ("1", "2"):  # the other batches' reports went through
        [other] = check_runs_named(stack, pr["head_sha"], f"gpuci / batch {batch}")
        assert other["fields"]["status"] == "completed"
    return pr, cpu, jobs


def test_a_report_failing_past_the_client_retries_is_scheduled_again(world: Stack) -> None:
    _report_outlasting_retries(world)


def test_the_scheduled_report_completes_the_check_run_once_github_is_back(world: Stack) -> None:
    pr, _, jobs = _report_outlasting_retries(world)
    reports = Queue(REPORTS_QUEUE, connection=world.redis)
    for job in jobs:
        ScheduledJobRegistry(queue=reports).remove(job)
        reports.enqueue_job(job)  # due now, as RQ's scheduler would enqueue it later
    world.process(REPORTS_QUEUE)
    [check] = check_runs_named(world, pr["head_sha"], "gpuci / batch cpu")
    assert check["fields"]["status"] == "completed"
    updates = [h["request"] for h in check["history"] if h["action"] == "updated"]
    assert sum(1 for u in updates if u.get("status") == "completed") == 1  # sent once
    assert check["fields"]["conclusion"] == SAMPLE_OUTCOMES["cpu"][1]


# --- 3. the events worker SIGKILLed while it handles a delivery ----------------------------------


def test_a_delivery_whose_events_worker_was_killed_is_handled_once_on_retry(
    world: Stack, tmp_path: Path
) -> None:
    """The events worker is killed while GitHub holds it back (429, Retry-After: 30) on creating
    the first Check Run of a `/gpuci run` comment, after its 👀 and its status comment; handling
    the delivery again makes nothing twice."""
    pr = world.open_pr("maya", "faster-optimizer", repo="acme/sample")
    world.process()
    sha, number = pr["head_sha"], pr["number"]
    fault(world, "POST", "/repos/acme/sample/check-runs", 429, 1, retry_after=30)
    sent = world.control(
        "POST",
        f"pulls/acme/sample/{number}/comments",
        {"user": "maya", "body": "/gpuci run batch 4 8\n/gpuci status"},
    )
    comment_id = sent["comment"]["id"]
    Pump(world.redis).drain()  # as the events process's pump would, before its worker starts
    events = Queue(EVENTS_QUEUE, connection=world.redis)
    [job_id] = events.get_job_ids()
    worker = start("events")
    try:
        wait_for(lambda: world.state()["faults"] == [], timeout_s=20)  # it is waiting out the 429
        assert job_id in [i.split(":")[0] for i in StartedJobRegistry(queue=events).get_job_ids()]
    finally:
        kill_all(worker, str(tmp_path / "app.pem"))
    # what it did before it died: 👀, the status comment, the run of batch 4 (no check run yet)
    assert run_of(world, number, "4", sha).check_run_id == 0
    assert check_runs_named(world, sha, "gpuci / batch 4") == []
    assert [c["user"] for c in world.comments(number, "acme/sample")].count("gpuci[bot]") == 1
    [mine] = [c for c in world.comments(number, "acme/sample") if c["id"] == comment_id]
    assert [f"{r['user']}:{r['content']}" for r in mine["reactions"]] == ["gpuci[bot]:eyes"]

    # RQ finds the abandoned job (its worker is gone) and schedules its retry; run it now
    StartedJobRegistry(queue=events).cleanup(timestamp=time.time() + 10**6)
    job = Job.fetch(job_id, connection=world.redis)
    retries = ScheduledJobRegistry(queue=events)
    if job_id in retries.get_job_ids():
        retries.remove(job)
        events.enqueue_job(job)
    else:  # an RQ that fails abandoned jobs outright
        FailedJobRegistry(queue=events).requeue(job_id)
    world.process()

    state = world.state()
    for name in {c["fields"]["name"] for c in state["check_runs"] if c["head_sha"] == sha}:
        assert len(check_runs_named(world, sha, name)) == 1, name
    for batch in ("4", "8"):
        run = run_of(world, number, batch, sha)
        assert run.state is RunState.PENDING
        [check] = check_runs_named(world, sha, f"gpuci / batch {batch}")
        assert check["id"] == run.check_run_id
        assert check["fields"]["status"] == "queued"
    bot_comments = [c for c in world.comments(number, "acme/sample") if c["user"] == "gpuci[bot]"]
    assert len(bot_comments) == 1, bot_comments  # the status comment, once
    [mine] = [c for c in world.comments(number, "acme/sample") if c["id"] == comment_id]
    assert [f"{r['user']}:{r['content']}" for r in mine["reactions"]] == ["gpuci[bot]:eyes"]
