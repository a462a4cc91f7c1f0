"""Whatever raises on a GPU host's run path ends the run: its GPUs released, its Check Run
completed as failure ("gpuci error on HOST: <exception>") with the log so far, `gpuci runs`
showing it; and a `gpuci worker` told to stop (SIGTERM) stops within its unit's grace.

The faults are injected with the explicit, test-only GPUCI_TEST_FAULT setting (workers/faults.py)
at each step: sources, setup, preflight, pytest start, result parsing, result storing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from bot import runs
from bot.cli import main as gpuci
from bot.reporting import REPORTS_QUEUE
from bot.runs import RunState, load_result
from contract import keys, leases
from contract.acl import acl_file
from contract.hostlink import Ticket
from contract.redis_errors import connect
from contract.settings import FAULT_STEPS, Settings, SettingsError
from tests.conftest import Stack
from tests.redis_server import PrivateRedis, private_redis_server, stack_on
from tests.test_deploy_files import ROOT, unit
from tests.test_e2e import (  # noqa: F401  (loop is a fixture)
    AUTO,
    E2E_WORLD,
    HOST,
    loop,
    register_host,
    schedule,
    start_worker,
    state_of,
    wait_for,
)
from workers.gpus import open_backend
from workers.host import publish_host, work_burst

# Steps after which the run's own log has something in it (setup ran).
LOGGED_BY = {"preflight", "pytest", "results", "store"}


def crash_run(stack: Stack) -> dict[str, runs.Run]:
    """A trusted PR's layer-2 batches, through the host in this process; its runs by batch."""
    pr = stack.open_pr("maya", "faster-optimizer", repo="acme/sample")
    stack.process()
    register_host(stack.redis)
    assert len(schedule(stack).dispatched) == len(AUTO)
    stack.work_host()
    stack.process(REPORTS_QUEUE)
    found = runs.runs_of_pr(stack.redis, "acme/sample", pr["number"])
    return {run.batch: run for run in found}


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_a_crash_at_any_step_fails_the_run_visibly(
    loop: Stack,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    step: str,
) -> None:
    monkeypatch.setenv("GPUCI_TEST_FAULT", step)
    ended = crash_run(loop)
    title = f"gpuci error on {HOST}: InjectedFault: injected fault at step {step!r}"
    for batch in AUTO:
        run = ended[batch]
        assert run.state is RunState.COMPLETED, (batch, run.state)
        assert run.conclusion == "failure"
        assert run.title.startswith(title), run.title
        check = loop.checks(run.sha)[f"gpuci / batch {batch}"]
        assert check["status"] == "completed" and check["conclusion"] == "failure"
        assert check["output"]["title"].startswith(title)
        assert "not a test result" in check["output"]["summary"]
        result = load_result(loop.redis, run.run_id)
        assert result is not None and result["title"] == run.title
        if step in LOGGED_BY:  # the log so far: setup ran before the fault
            assert "setup: nothing to install" in result["log_tail"]
            assert "## Log tail" in check["output"]["text"]
            assert "setup: nothing to install" in check["output"]["text"]
    gpus = [g for run in ended.values() for g in run.gpus]
    assert gpus and all(v is None for v in leases.holders(loop.redis, HOST, range(8)).values())
    assert not loop.redis.lrange(keys.host_taken(HOST), 0, -1)  # no ticket left behind
    assert gpuci(["runs"]) == 0
    listed = capsys.readouterr().out
    assert listed.count(f"failure: {title}") == len(AUTO)


def test_a_crash_in_a_real_workers_run_process_ends_the_run(
    loop: Stack,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUCI_TEST_FAULT", "pytest")
    pr = loop.open_pr("maya", "faster-optimizer", repo="acme/sample")
    loop.process()
    worker = start_worker()
    try:
        wait_for(lambda: bool(loop.redis.exists(keys.host_alive(HOST))))
        assert len(schedule(loop).dispatched) == len(AUTO)
        found = runs.runs_of_pr(loop.redis, "acme/sample", pr["number"])
        for run in found:
            wait_for(lambda run=run: state_of(loop, run.run_id) is RunState.COMPLETED)
        assert worker.poll() is None  # the worker itself goes on
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    for run in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]):
        assert run.conclusion == "failure"
        assert run.title.startswith(f"gpuci error on {HOST}: InjectedFault")


def test_sigterm_stops_a_busy_worker_within_its_grace(loop: Stack) -> None:  # noqa: F811
    """The unit gives the worker TimeoutStopSec before SIGKILL; it stops well within it, its
    running batch stopped and re-queued."""
    service = unit(ROOT / "deploy" / "systemd" / "gpuci-worker.service")
    grace_s = float(service["Service"]["TimeoutStopSec"])
    settings = Settings.from_env()
    pr = loop.open_pr("maya", "slow-gpu", repo="acme/sample")  # batch 1 hangs for 2 minutes
    loop.process()
    worker = start_worker()
    try:
        wait_for(lambda: bool(loop.redis.exists(keys.host_alive(HOST))))
        schedule(loop)
        one = next(
            r for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]) if r.batch == "1"
        )
        wait_for(lambda: state_of(loop, one.run_id) is RunState.RUNNING)
        time.sleep(1)  # pytest is up
        asked = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=grace_s)
        took = time.monotonic() - asked
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    # the batch's kill grace, the cancel watcher's second and the reports, far inside the unit's
    assert took < settings.kill_grace_s + 10 < grace_s, took
    loop.process()
    stopped = runs.get_run(loop.redis, one.run_id)
    assert stopped is not None and stopped.state is RunState.PENDING
    assert f"the worker on {HOST} was stopped while the batch ran" in stopped.wait_reason


def test_an_unknown_fault_step_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="GPUCI_TEST_FAULT='pytset' is not one of sources"):
        Settings.from_env({"GPUCI_TEST_FAULT": "pytset"}, dotenv=None)


# --- a real fault: a Redis that refuses the host's write --------------------------------------


@pytest.fixture
def refusing_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[tuple[Stack, PrivateRedis]]:
    """The e2e world on a redis-server with gpuci's ACL, except that the host's login may not
    touch some of its own keys: by default its JUnit uploads (`gpuci:host:H:junit:*`, so
    storing a result is refused); `request.param` names the first letters refused."""
    refused = getattr(request, "param", "j")
    acl = acl_file([HOST]).replace(">CHANGE-ME-", ">")
    own = f"~gpuci:host:{HOST}:*"
    assert own in acl
    aclfile = tmp_path / "gpuci-acl.conf"
    aclfile.write_text(acl.replace(own, f"~gpuci:host:{HOST}:[^{refused}]*"))
    monkeypatch.setenv("GPUCI_HOST", HOST)
    monkeypatch.setenv("GPUCI_GPU_BACKEND", "sim:8xH20-96GB")
    monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("GPUCI_IDLE_SAMPLE_INTERVAL_S", "0")
    with (
        private_redis_server(tmp_path / "redis", aclfile=aclfile) as server,
        stack_on(server, E2E_WORLD, tmp_path, monkeypatch) as (stack, _app),
    ):
        yield stack, server


def host_of(stack: Stack, server: PrivateRedis) -> tuple[Redis, Settings]:
    """The host's login and settings, the host registered and the PR's runs dispatched."""
    login = server.url_as(f"gpuci-host-{HOST}", f"host-{HOST}-password")
    settings = Settings.from_env({**os.environ, "REDIS_URL": login}, dotenv=None)
    host = connect(login)  # as `gpuci worker` connects
    publish_host(host, settings, open_backend(settings.gpu_backend), slots=4)
    assert len(schedule(stack).dispatched) == len(AUTO)
    return host, settings


def test_a_result_the_redis_refuses_to_store_fails_the_run_saying_so(
    refusing_stack: tuple[Stack, PrivateRedis],
) -> None:
    stack, server = refusing_stack
    pr = stack.open_pr("maya", "faster-optimizer", repo="acme/sample")
    stack.process()
    host, settings = host_of(stack, server)
    assert work_burst(host, settings) == len(AUTO)
    stack.process(REPORTS_QUEUE)
    for run in runs.runs_of_pr(stack.redis, "acme/sample", pr["number"]):
        assert run.state is RunState.COMPLETED and run.conclusion == "failure", run
        refused = f"gpuci error on {HOST}: Redis permission denied: for SET on key "
        assert run.title.startswith(refused + keys.host_junit(HOST, run.run_id)), run.title
        check = stack.checks(run.sha)[f"gpuci / batch {run.batch}"]
        assert check["conclusion"] == "failure"
        assert check["output"]["title"] == run.title
        assert "pytest" in check["output"]["text"]  # the run's log up to the refused write
        assert f"host-{HOST}-password" not in check["output"]["text"] + run.title
    assert all(v is None for v in leases.holders(stack.redis, HOST, range(8)).values())


@pytest.mark.parametrize("refusing_stack", ["o"], indirect=True)  # the host's outbox
def test_a_run_whose_error_cannot_be_told_keeps_its_ticket_for_the_next_start(
    refusing_stack: tuple[Stack, PrivateRedis],
) -> None:
    stack, server = refusing_stack
    pr = stack.open_pr("maya", "faster-optimizer", repo="acme/sample")
    stack.process()
    host, settings = host_of(stack, server)
    assert work_burst(host, settings) == len(AUTO)  # each: "started" refused, the error too
    taken = [Ticket.from_json(raw) for raw in host.lrange(keys.host_taken(HOST), 0, -1)]
    dispatched = {r.run_id for r in runs.runs_of_pr(stack.redis, "acme/sample", pr["number"])}
    assert {t.run_id for t in taken} == dispatched  # a restarted worker reports them lost
    assert all(v is None for v in leases.holders(stack.redis, HOST, range(8)).values())


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:  # the field after the state
                found.append(int(entry.name))
    return found


def test_a_run_process_killed_mid_batch_fails_its_run_at_once(loop: Stack) -> None:  # noqa: F811
    """Not an exception at all: the run's process is SIGKILLed (as the OOM killer would). The
    worker sees it die and the run fails at once, naming how, its GPUs released."""
    pr = loop.open_pr("maya", "slow-gpu", repo="acme/sample")  # batch 1 hangs for 2 minutes
    loop.process()
    worker = start_worker()
    try:
        wait_for(lambda: bool(loop.redis.exists(keys.host_alive(HOST))))
        schedule(loop)
        one = next(
            r for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]) if r.batch == "1"
        )
        wait_for(lambda: state_of(loop, one.run_id) is RunState.RUNNING)
        # the run processes are the worker's children that have children (the spare has none)
        wait_for(lambda: any(children_of(c) for c in children_of(worker.pid)))
        running = [c for c in children_of(worker.pid) if children_of(c)]
        for pid in running:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: state_of(loop, one.run_id) is RunState.COMPLETED, timeout_s=20)
        assert worker.poll() is None  # the worker goes on
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    failed = runs.get_run(loop.redis, one.run_id)
    assert failed is not None and failed.conclusion == "failure"
    assert failed.title.startswith(f"gpuci error on {HOST}: RuntimeError: the run's process")
    assert "died (killed by signal 9)" in failed.title
    assert all(v is None for v in leases.holders(loop.redis, HOST, range(8)).values())
    assert not loop.redis.lrange(keys.host_taken(HOST), 0, -1)
