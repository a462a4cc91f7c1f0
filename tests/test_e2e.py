"""The whole loop: fakehub PR -> signed webhook -> events worker -> scheduler -> GPU host worker
on a simulated 8-GPU host -> real pytest on fakehub's tarball -> Check Runs on fakehub."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from redis import Redis
from rq import Queue

from bot import runs, scheduler
from bot.github_app import GitHubApp
from bot.reporting import REPORTS_QUEUE
from bot.runs import Run, RunState, load_result
from contract import keys, leases
from contract.checks import inline
from contract.settings import Settings
from tests.conftest import Stack, serve_stack
from tests.test_cli import SAMPLE_OUTCOMES
from workers.gpus import open_backend
from workers.host import publish_host

E2E_WORLD = Path(__file__).parent / "data" / "world-e2e.yml"
HOST = "sim-h20-01"
AUTO = ["cpu", "1", "2"]  # layer 2 of examples/sample-repo/.gpuci.yml


@pytest.fixture
def loop(
    redis_conn: Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    with serve_stack(E2E_WORLD, redis_conn, redis_url, tmp_path, monkeypatch) as found:
        monkeypatch.setenv("GPUCI_HOST", HOST)
        monkeypatch.setenv("GPUCI_GPU_BACKEND", "sim:8xH20-96GB")
        monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
        monkeypatch.setenv("GPUCI_IDLE_SAMPLE_INTERVAL_S", "0")
        monkeypatch.setenv("GPUCI_KILL_GRACE_S", "1")
        yield found


def register_host(conn: Redis) -> None:
    settings = Settings.from_env()
    publish_host(conn, settings, open_backend(settings.gpu_backend), slots=9)


def schedule(stack: Stack) -> scheduler.TickReport:
    settings = Settings.from_env()
    app = GitHubApp.from_settings(settings)

    def source_token(run: Run) -> str:
        name = run.repo.split("/", 1)[1]
        return app.source_token(run.installation_id, name, recheck=run.trust == "approved")

    return scheduler.tick(stack.redis, source_token, settings.github_api_url)


def run_everything(stack: Stack) -> None:
    """Events, then scheduling rounds with the host's runs and the reports, until nothing moves."""
    stack.process()
    for _ in range(10):
        register_host(stack.redis)  # the heartbeat a real `gpuci worker` renews every 3 s
        done = schedule(stack)
        stack.work_host()
        stack.process(REPORTS_QUEUE)
        if not done.dispatched and not runs.pending_runs(stack.redis):
            return


def wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def test_trusted_pr_runs_layer_2_and_reports_pytest_counts(loop: Stack) -> None:
    pr = loop.open_pr("maya", "faster-optimizer", repo="acme/sample")
    run_everything(loop)
    sha = pr["head_sha"]
    checks = loop.checks(sha)
    for batch in AUTO:
        check = checks[f"gpuci / batch {batch}"]
        _, conclusion, counts = SAMPLE_OUTCOMES[batch]
        assert check["status"] == "completed", check
        assert check["conclusion"] == conclusion
        run = next(
            r for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]) if r.batch == batch
        )
        result = load_result(loop.redis, run.run_id)
        assert result is not None
        assert {k: result[k] for k in counts} == counts  # pytest's own counts
        assert result["sha"] == sha
        assert check["details_url"].endswith(f"/runs/{run.run_id}")
    assert "now pass" in checks["gpuci / batch 1"]["output"]["title"]
    annotations = checks["gpuci / batch 2"]["output"]["annotations"]
    failed = {(a["path"], a["annotation_level"]) for a in annotations}
    assert ("tests/test_dist.py", "failure") in failed
    assert any("gradient" in a["title"] + a["message"] for a in annotations)
    # the web process's /metrics counts the events worker's GitHub calls and its budget
    metrics = requests.get(f"{loop.web_url}/metrics", timeout=10).text
    assert 'gpuci_github_calls_total{method="POST",status="2xx"}' in metrics
    assert "gpuci_github_rate_limit_remaining 4999" in metrics
    # every GPU is free again, and the runs are completed
    assert all(v is None for v in leases.holders(loop.redis, HOST, range(8)).values())
    assert {r.state for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"])} == {
        RunState.COMPLETED
    }
    # each Check Run says in what runtime it ran, as the run saw it
    summary = checks["gpuci / batch cpu"]["output"]["summary"]
    sandbox = "bubblewrap" if shutil.which("bwrap") else "none"
    assert "### Runtime" in summary and f"| sandbox | {sandbox} |" in summary
    assert f"| Python | {inline(platform.python_version())} |" in summary
    # the successful runs' directories are gone; the failed run's is kept for debugging
    kept = sorted(d.name.split("-")[1] for d in (Path(os.environ["GPUCI_WORK_DIR"])).iterdir())
    by_batch = {r.run_id: r.batch for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"])}
    assert [by_batch[k] for k in kept] == ["2"]


def test_check_run_goes_queued_in_progress_completed(loop: Stack) -> None:
    """With a real `gpuci events` process reporting while the batch runs, the Check Run shows
    each state once, in order."""
    pr = loop.open_pr("maya", "faster-optimizer", repo="acme/sample")
    loop.process()
    register_host(loop.redis)
    events = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "events"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert schedule(loop).dispatched
        loop.work_host()
        wait_for(lambda: Queue(REPORTS_QUEUE, connection=loop.redis).count == 0)
        time.sleep(0.5)  # the last job may still be in flight after leaving the queue
    finally:
        events.terminate()
        events.wait(timeout=10)
    history = [
        c
        for c in loop.state()["check_runs"]
        if c["head_sha"] == pr["head_sha"] and c["fields"]["name"] == "gpuci / batch cpu"
    ]
    assert len(history) == 1  # one Check Run per batch, updated, never duplicated
    statuses = [h["request"].get("status") for h in history[0]["history"]]
    statuses = [s for s in statuses if s]
    assert statuses[0] == "queued"
    assert "in_progress" in statuses
    assert statuses[-1] == "completed"
    assert statuses.count("completed") == 1


def test_fork_pr_waits_for_approval_then_runs_and_push_voids_it(loop: Stack) -> None:
    pr = loop.open_pr("carl", "fork-fix", head_repo="carl/sample", repo="acme/sample")
    run_everything(loop)
    sha = pr["head_sha"]
    assert {c["conclusion"] for c in loop.checks(sha).values() if "batch" in c["name"]} == {
        "action_required"
    }
    assert runs.pending_runs(loop.redis) == []
    loop.control(
        "POST",
        f"pulls/acme/sample/{pr['number']}/labels",
        {"user": "maya", "add": "gpuci/approved"},
    )
    labelled_at = time.time()
    run_everything(loop)
    approved = loop.checks(sha)
    assert approved["gpuci / batch cpu"]["conclusion"] == "success"
    assert approved["gpuci / batch 2"]["conclusion"] == "failure"
    # the audit trail: who approved this fork's code, how and when (not the PR's author)
    ran = [r for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]) if r.sha == sha]
    assert {(r.batch, r.requested_by, r.approved_by, r.approved_via) for r in ran} == {
        (batch, "maya", "maya", "label") for batch in AUTO
    }
    assert all(labelled_at - 5 < r.approved_at < time.time() for r in ran)
    audit = ran[0].approval_text
    assert audit.startswith("Approved by maya (label, 20")
    for check in approved.values():
        if "batch" in check["name"]:
            assert check["output"]["summary"].startswith(f"{audit}.\n\n")
    page = requests.get(f"{loop.web_url}/runs/{ran[0].run_id}", timeout=10).text
    assert "approval by maya (approved)" in page and audit in page and "carl" not in page
    pushed = loop.control(
        "POST",
        f"pulls/acme/sample/{pr['number']}/push",
        {"files": {"README.md": "sneaky change\n"}},
    )
    run_everything(loop)
    new_sha = pushed["sha"]
    assert {c["conclusion"] for c in loop.checks(new_sha).values() if "batch" in c["name"]} == {
        "action_required"
    }
    assert runs.approval_for(loop.redis, "acme/sample", pr["number"]) is None
    assert "gpuci/approved" not in json.dumps(loop.state()["pulls"])


@pytest.mark.parametrize("change", ["push", "demotion"])
def test_the_host_rechecks_approved_fork_code_with_github_before_it_runs(
    loop: Stack, change: str
) -> None:
    """Between the bot's decision and the host's start, GitHub changed: the PR got a new head
    (its webhook not yet handled) or the approver lost write access. The host asks GitHub
    itself, runs nothing and says why."""
    pr = loop.open_pr("carl", "fork-fix", head_repo="carl/sample", repo="acme/sample")
    label = {"user": "maya", "add": "gpuci/approved"}
    loop.control("POST", f"pulls/acme/sample/{pr['number']}/labels", label)
    loop.process()
    register_host(loop.redis)
    assert schedule(loop).dispatched
    if change == "push":
        loop.control("POST", f"pulls/acme/sample/{pr['number']}/push", {"files": {"x": "y\n"}})
        why = "refused: the PR's head is now"
    else:
        loop.control("PUT", "permissions", {"repo": "acme/sample", "user": "maya", "role": "read"})
        why = "refused: maya, who approved"

    assert loop.work_host() == len(AUTO)

    every = runs.runs_of_pr(loop.redis, "acme/sample", pr["number"])
    old = [r for r in every if r.sha == pr["head_sha"]]
    assert old and all(r.state is RunState.COMPLETED and r.conclusion == "failure" for r in old), [
        (r.state, r.title, r.wait_reason) for r in old
    ]
    assert all(r.title.startswith(why) for r in old), [r.title for r in old]
    assert all(load_result(loop.redis, r.run_id) is None for r in old)  # no pytest ran
    assert not list(Path(os.environ["GPUCI_WORK_DIR"]).glob("*/box"))
    assert all(v is None for v in leases.holders(loop.redis, HOST, range(8)).values())


def test_push_supersedes_a_running_batch(loop: Stack) -> None:
    """A real `gpuci worker` runs a batch that would hang for two minutes; a push cancels it:
    the process group dies, the GPUs are released, the old Check Run says superseded."""
    pr = loop.open_pr("maya", "slow-cpu", repo="acme/sample")
    loop.process()
    worker = start_worker()
    try:
        wait_for(lambda: bool(loop.redis.exists(keys.host_alive(HOST))))
        assert len(schedule(loop).dispatched) == 3
        slow = next(
            r for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]) if r.batch == "cpu"
        )
        wait_for(lambda: state_of(loop, slow.run_id) is RunState.RUNNING)
        pushed = loop.control(
            "POST",
            f"pulls/acme/sample/{pr['number']}/push",
            {"files": {"README.md": "new commit\n"}},
        )
        loop.process()
        started = time.monotonic()
        wait_for(lambda: finished(loop, slow.run_id), timeout_s=60)
        assert time.monotonic() - started < 30  # killed, not waited out
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    cancelled = runs.get_run(loop.redis, slow.run_id)
    assert cancelled is not None and cancelled.state is RunState.CANCELLED
    assert "Superseded by commit" in cancelled.wait_reason
    assert all(v is None for v in leases.holders(loop.redis, HOST, range(8)).values())
    loop.process(REPORTS_QUEUE)
    old = loop.checks(pr["head_sha"])["gpuci / batch cpu"]
    assert old["conclusion"] == "cancelled"
    assert pushed["sha"][:12] in old["output"]["title"] + old["output"]["summary"]
    # its Check Run was completed once, when it was cancelled, though its host reported after
    patches = [h["request"] for h in check_history(loop, old["id"])]
    assert [p.get("status") for p in patches].count("completed") == 1, patches
    assert load_result(loop.redis, slow.run_id) is not None  # the host's report did arrive
    new = {
        r.batch: r.state
        for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"])
        if r.sha == pushed["sha"]
    }
    assert new == dict.fromkeys(AUTO, RunState.PENDING)


def check_history(stack: Stack, check_id: int) -> list[dict[str, Any]]:
    """Every create and update request fakehub recorded for one Check Run."""
    found = next(c for c in stack.state()["check_runs"] if c["id"] == check_id)
    return list(found["history"])


def start_worker() -> subprocess.Popen[bytes]:
    """A real `gpuci worker` for the simulated host, with the environment the fixture set."""
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "worker", "--host", HOST, "--slots", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def state_of(stack: Stack, run_id: str) -> RunState | None:
    run = runs.get_run(stack.redis, run_id)
    return run.state if run else None


def finished(stack: Stack, run_id: str) -> bool:
    run = runs.get_run(stack.redis, run_id)
    return run is not None and run.finished_at > 0


def test_a_batch_whose_gpu_lease_is_lost_is_stopped(
    loop: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCI_LEASE_TTL_S", "3")  # renewed every second
    pr = loop.open_pr("maya", "slow-gpu", repo="acme/sample")
    loop.process()
    worker = start_worker()
    try:
        wait_for(lambda: bool(loop.redis.exists(keys.host_alive(HOST))))
        schedule(loop)
        one = next(
            r for r in runs.runs_of_pr(loop.redis, "acme/sample", pr["number"]) if r.batch == "1"
        )
        wait_for(lambda: state_of(loop, one.run_id) is RunState.RUNNING)
        (gpu,) = runs.get_run(loop.redis, one.run_id).gpus  # type: ignore[union-attr]
        loop.redis.set(keys.gpu_lease(HOST, gpu), "someone-else")  # the lease is taken away
        wait_for(lambda: finished(loop, one.run_id), timeout_s=30)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    stopped = runs.get_run(loop.redis, one.run_id)
    assert stopped is not None
    assert stopped.conclusion == "cancelled"
    assert "lease" in stopped.title
    assert loop.redis.hget(keys.leases_lost(), "heartbeat") == b"1"  # gpuci_leases_lost_total
