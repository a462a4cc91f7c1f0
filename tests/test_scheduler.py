"""The scheduler and the GPU host worker against real Redis and real RQ: waits, unrunnable
batches, lost hosts, GPUs that get busy, and the worker's own checks at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue

from bot import runs, scheduler
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, RunTrigger
from contract import keys, leases
from contract.settings import Settings
from tests.conftest import SAMPLE_REPO
from workers.gpus import open_backend
from workers.host import publish_host

CONFIG = (SAMPLE_REPO / ".gpuci.yml").read_text()
HOST = "h1"
SHA = "c" * 40


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Path) -> Settings:
    for name, value in {
        "REDIS_URL": redis_url,
        "GPUCI_HOST": HOST,
        "GPUCI_GPU_BACKEND": "sim:8xH20-96GB",
        "GPUCI_WORK_DIR": str(tmp_path / "runs"),
        "GPUCI_IDLE_SAMPLE_INTERVAL_S": "0",
    }.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env(dotenv=None)


@pytest.fixture(autouse=True)
def installation(redis_conn: Redis) -> None:
    """acme/sample is served by installation 1, as the events process records it."""
    redis_conn.hset(keys.repos(), "acme/sample", "1")


def register(conn: Redis, settings: Settings, backend: str | None = None) -> None:
    publish_host(conn, settings, open_backend(backend or settings.gpu_backend), slots=9)


def pending(conn: Redis, batch: str, *, trust: str = "trusted", pr: int = 7) -> Run:
    return runs.create_run(
        conn,
        repo="acme/sample",
        installation_id=1,
        pr=pr,
        sha=SHA,
        batch=batch,
        trigger=RunTrigger.PULL_REQUEST,
        requested_by="maya",
        config_text=CONFIG,
        trust=trust,
    )


def tick(conn: Redis) -> scheduler.TickReport:
    return scheduler.tick(conn, lambda run: "token", "http://127.0.0.1:1")


def reports(conn: Redis) -> int:
    return Queue(REPORTS_QUEUE, connection=conn).count


def test_several_batches_are_packed_onto_disjoint_gpus(
    redis_conn: Redis, settings: Settings
) -> None:
    register(redis_conn, settings)
    made = [pending(redis_conn, b) for b in ("1", "2", "4")]
    done = tick(redis_conn)
    assert sorted(done.dispatched) == sorted(r.run_id for r in made)
    used = [set(runs.get_run(redis_conn, r.run_id).gpus) for r in made]  # type: ignore[union-attr]
    assert sum(len(u) for u in used) == 7
    assert len(set().union(*used)) == 7  # no GPU twice
    assert redis_conn.llen(keys.host_tickets(HOST)) == 3


def test_no_token_is_minted_for_a_repository_outside_the_runs_installation(
    redis_conn: Redis, settings: Settings
) -> None:
    register(redis_conn, settings)
    redis_conn.hset(keys.repos(), "acme/sample", "2")  # moved to another installation
    run = pending(redis_conn, "1")
    minted: list[str] = []

    done = scheduler.tick(redis_conn, lambda r: minted.append(r.run_id) or "t", "http://x")

    assert done.dispatched == [] and minted == []
    failed = runs.get_run(redis_conn, run.run_id)
    assert failed is not None and failed.state is RunState.COMPLETED
    assert failed.title.startswith("refused: gpuci has not heard of acme/sample in installation 1")
    assert redis_conn.llen(keys.host_tickets(HOST)) == 0


def test_a_batch_no_host_can_ever_run_fails_at_once(redis_conn: Redis, settings: Settings) -> None:
    register(redis_conn, settings, "sim:1xT4-16GB")
    run = pending(redis_conn, "2")
    done = tick(redis_conn)
    assert run.run_id in done.failed
    failed = runs.get_run(redis_conn, run.run_id)
    assert failed is not None
    assert (failed.state, failed.conclusion) == (RunState.COMPLETED, "failure")
    assert "needs 2 GPUs" in failed.title
    assert reports(redis_conn) == 1


def test_waiting_run_shows_why_and_reports_only_changes(
    redis_conn: Redis, settings: Settings
) -> None:
    register(redis_conn, settings)
    assert leases.acquire(redis_conn, HOST, [0, 1], "other-run:x", 60)
    run = pending(redis_conn, "8")
    tick(redis_conn)
    waiting = runs.get_run(redis_conn, run.run_id)
    assert waiting is not None and waiting.state is RunState.PENDING
    assert "waiting for 8 idle GPUs" in waiting.wait_reason
    assert "largest idle set: 6 on h1" in waiting.wait_reason
    assert "position 1" in waiting.wait_reason
    tick(redis_conn)
    tick(redis_conn)
    assert reports(redis_conn) == 1  # the reason did not change: no new Check Run update
    leases.release(redis_conn, HOST, [0, 1], "other-run:x")
    assert tick(redis_conn).dispatched == [run.run_id]


def test_runs_of_a_lost_host_are_requeued_once_then_failed(
    redis_conn: Redis, settings: Settings
) -> None:
    register(redis_conn, settings)
    run = pending(redis_conn, "1")
    assert tick(redis_conn).dispatched == [run.run_id]
    redis_conn.delete(keys.host_alive(HOST))  # the heartbeat stopped
    assert tick(redis_conn).requeued == [run.run_id]
    again = runs.get_run(redis_conn, run.run_id)
    assert again is not None
    assert (again.state, again.attempts) == (RunState.PENDING, 1)
    assert again.wait_reason.startswith("re-queued: worker lost on h1; ")
    assert all(v is None for v in leases.holders(redis_conn, HOST, range(8)).values())
    register(redis_conn, settings)
    assert tick(redis_conn).dispatched == [run.run_id]
    redis_conn.delete(keys.host_alive(HOST))
    assert tick(redis_conn).failed == {run.run_id: "worker lost on h1"}
    assert redis_conn.hget(keys.leases_lost(), "host_lost") == b"2"


def test_worker_requeues_when_a_gpu_got_busy_before_start(
    redis_conn: Redis, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "gpus.json"
    gpus = [{"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"} for _ in range(2)]
    spec.write_text(json.dumps({"gpus": gpus}))
    monkeypatch.setenv("GPUCI_GPU_BACKEND", f"sim:{spec}")
    register(redis_conn, Settings.from_env(dotenv=None))
    run = pending(redis_conn, "1")
    assert tick(redis_conn).dispatched == [run.run_id]
    gpus[0]["processes"] = [{"pid": 999, "used_memory_mb": 20000, "name": "someone"}]
    spec.write_text(json.dumps({"gpus": gpus}))  # a foreign process appears before start
    process_host_queue(redis_conn)
    back = runs.get_run(redis_conn, run.run_id)
    assert back is not None and back.state is RunState.PENDING
    assert "GPUs got busy before start" in back.wait_reason
    assert "pid 999" in back.wait_reason
    assert leases.holders(redis_conn, HOST, [0])[0] is None


def test_a_commit_whose_approval_was_voided_is_never_dispatched(
    redis_conn: Redis, settings: Settings
) -> None:
    register(redis_conn, settings)
    run = pending(redis_conn, "1", trust="approved")  # approved once; no approval stored now
    assert tick(redis_conn).dispatched == []
    assert redis_conn.llen(keys.host_tickets(HOST)) == 0  # no ticket, no source token minted
    refused = runs.get_run(redis_conn, run.run_id)
    assert refused is not None
    assert (refused.state, refused.conclusion) == (RunState.COMPLETED, "failure")
    assert "no longer trusted or approved" in refused.title
    assert all(v is None for v in leases.holders(redis_conn, HOST, range(8)).values())


def test_cancelled_before_start_does_nothing(redis_conn: Redis, settings: Settings) -> None:
    register(redis_conn, settings)
    run = pending(redis_conn, "1")
    assert tick(redis_conn).dispatched == [run.run_id]
    runs.cancel_runs(redis_conn, "acme/sample", 7, "Superseded by commit `abc`.")
    process_host_queue(redis_conn)
    cancelled = runs.get_run(redis_conn, run.run_id)
    assert cancelled is not None and cancelled.state is RunState.CANCELLED
    assert all(v is None for v in leases.holders(redis_conn, HOST, range(8)).values())


def process_host_queue(conn: Redis) -> None:
    """The host runs its tickets here; the bot applies what it says."""
    from bot import hostlink
    from workers.host import work_burst

    work_burst(conn, Settings.from_env(dotenv=None))
    hostlink.drain(conn)


def test_a_host_takes_no_more_runs_than_its_slots(redis_conn: Redis, settings: Settings) -> None:
    publish_host(redis_conn, settings, open_backend(settings.gpu_backend), slots=2)
    made = [pending(redis_conn, "1") for _ in range(4)]
    assert len(tick(redis_conn).dispatched) == 2
    assert tick(redis_conn).dispatched == []  # both slots still busy
    waiting = [runs.get_run(redis_conn, r.run_id) for r in made]
    assert sum(1 for r in waiting if r and r.state is RunState.PENDING) == 2


def test_runs_asked_for_together_start_largest_first(redis_conn: Redis, settings: Settings) -> None:
    publish_host(redis_conn, settings, open_backend("sim:8xH20-96GB"), slots=1)
    small, big = (
        runs.create_run(
            redis_conn,
            repo="acme/sample",
            installation_id=1,
            pr=0,
            sha=SHA,
            batch=batch,
            trigger=RunTrigger.SCHEDULE,
            requested_by="schedule",
            config_text=CONFIG,
            trust="trusted",
            created_at=1000.0,
        )
        for batch in ("1", "8")
    )
    assert tick(redis_conn).dispatched == [big.run_id]
    assert small.run_id != big.run_id


def test_a_restarted_worker_requeues_what_it_was_running(
    redis_conn: Redis, settings: Settings
) -> None:
    from bot.hostlink import recover_host_runs

    register(redis_conn, settings)
    running, assigned = pending(redis_conn, "1"), pending(redis_conn, "2")
    assert len(tick(redis_conn).dispatched) == 2
    runs.transition(redis_conn, running.run_id, {RunState.ASSIGNED}, state=RunState.RUNNING)
    assert recover_host_runs(redis_conn, HOST) == [running.run_id]
    again = runs.get_run(redis_conn, running.run_id)
    assert again is not None and again.state is RunState.PENDING
    assert again.wait_reason == "re-queued: worker restarted on h1"
    still = runs.get_run(redis_conn, assigned.run_id)
    assert still is not None and still.state is RunState.ASSIGNED  # its job is still queued


TORCH_CONFIG = CONFIG.replace(
    "\nbatches:",
    "\nruntimes:\n  torch: {base: torch2.13-cu13.0, expect: {torch: '2.13'}}\nbatches:",
    1,
).replace("cpu: {gpus: 0,", "cpu: {runtime: torch, gpus: 0,", 1)


def test_a_run_waits_for_a_host_with_its_runtime_and_says_so(
    redis_conn: Redis, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from bot.cli import main

    register(redis_conn, settings)  # provides only the default base
    run = runs.create_run(
        redis_conn, repo="acme/sample", installation_id=1, pr=7, sha=SHA, batch="cpu",
        trigger=RunTrigger.PULL_REQUEST, requested_by="maya", config_text=TORCH_CONFIG,
        trust="trusted",
    )  # fmt: skip

    tick(redis_conn)

    waiting = runs.get_run(redis_conn, run.run_id)
    assert waiting is not None and waiting.state is RunState.PENDING
    reason = "waiting: no host provides runtime torch (torch2.13-cu13.0)"
    assert waiting.wait_reason.startswith(reason)
    assert reports(redis_conn) == 1  # the Check Run says it too
    assert main(["runs"]) == 0
    assert reason in capsys.readouterr().out
    backend = open_backend(settings.gpu_backend)
    publish_host(redis_conn, settings, backend, 9, ["base:default", "base:torch2.13-cu13.0"])
    assert tick(redis_conn).dispatched == [run.run_id]


def test_a_host_with_a_full_disk_takes_no_runs(
    redis_conn: Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCI_MIN_FREE_DISK", "1000000TiB")
    register(redis_conn, Settings.from_env(dotenv=None))
    run = pending(redis_conn, "cpu")

    tick(redis_conn)

    waiting = runs.get_run(redis_conn, run.run_id)
    assert waiting is not None and waiting.state is RunState.PENDING
    assert waiting.wait_reason.startswith(f"waiting: {HOST} takes no runs: only ")
    assert "below GPUCI_MIN_FREE_DISK" in waiting.wait_reason
