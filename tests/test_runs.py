"""The runs data model in a real Redis: runs, the pending order, approvals, heads, records."""

from __future__ import annotations

import time

from redis import Redis

from bot import runs
from bot.runs import RunState, RunTrigger
from bot.trust import Approval, ApprovalVia

REPO = "acme/gpu"
SHA_A, SHA_B = "a" * 40, "b" * 40


def new_run(conn: Redis, batch: str = "2", **fields: object) -> runs.Run:
    values: dict[str, object] = {
        "repo": REPO,
        "installation_id": 201,
        "pr": 7,
        "sha": SHA_A,
        "batch": batch,
        "trigger": RunTrigger.PULL_REQUEST,
        "requested_by": "alice",
        **fields,
    }
    return runs.create_run(conn, **values)  # type: ignore[arg-type]


def test_a_run_reads_back_as_written(redis_conn: Redis) -> None:
    run = new_run(redis_conn, config_text="version: 1\n")
    assert runs.get_run(redis_conn, run.run_id) == run
    moved = runs.update_run(redis_conn, run, state=RunState.RUNNING, host="h1", gpus=(0, 3))
    found = runs.get_run(redis_conn, run.run_id)
    assert found == moved
    assert found is not None and (found.host, found.gpus, found.state) == ("h1", (0, 3), "running")
    assert runs.get_run(redis_conn, "nope") is None


def test_pending_runs_go_by_priority_then_age(redis_conn: Redis) -> None:
    scheduled = new_run(redis_conn, "10", pr=0, trigger=RunTrigger.SCHEDULE)
    command = new_run(redis_conn, "5", trigger=RunTrigger.COMMAND)
    automatic = new_run(redis_conn, "2")
    later = new_run(redis_conn, "3")
    waiting = new_run(redis_conn, "4", state=RunState.AWAITING_APPROVAL)
    order = [r.run_id for r in runs.pending_runs(redis_conn)]
    assert order == [automatic.run_id, later.run_id, command.run_id, scheduled.run_id]
    runs.mark_pending(redis_conn, waiting, RunTrigger.APPROVAL, "wendy")
    runs.update_run(redis_conn, automatic, state=RunState.ASSIGNED, host="h1")
    order = [r.run_id for r in runs.pending_runs(redis_conn)]
    assert order == [later.run_id, command.run_id, waiting.run_id, scheduled.run_id]


def test_cancel_runs_cancels_the_active_ones_and_returns_them(redis_conn: Redis) -> None:
    old = new_run(redis_conn, "2")
    awaiting = new_run(redis_conn, "5", state=RunState.AWAITING_APPROVAL)
    done = runs.update_run(redis_conn, new_run(redis_conn, "10"), state=RunState.COMPLETED)
    current = new_run(redis_conn, "2", sha=SHA_B)
    other_pr = new_run(redis_conn, "2", pr=8)
    cancelled = runs.cancel_runs(redis_conn, REPO, 7, "superseded", keep_sha=SHA_B)
    assert [r.run_id for r in cancelled] == [old.run_id, awaiting.run_id]
    assert {r.wait_reason for r in cancelled} == {"superseded"}
    assert [r.run_id for r in runs.pending_runs(redis_conn)] == [current.run_id, other_pr.run_id]
    assert runs.cancel_runs(redis_conn, REPO, 7, "again", keep_sha=SHA_B) == []
    assert [r.run_id for r in runs.cancel_runs(redis_conn, REPO, 7, "closed")] == [current.run_id]
    assert runs.get_run(redis_conn, done.run_id).state is RunState.COMPLETED  # type: ignore[union-attr]


def test_runs_of_a_pr_and_at_a_commit(redis_conn: Redis) -> None:
    first, second = new_run(redis_conn, "2"), new_run(redis_conn, "5", sha=SHA_B)
    third = new_run(redis_conn, "2", pr=9)
    assert [r.run_id for r in runs.runs_of_pr(redis_conn, "ACME/gpu", 7)] == [
        first.run_id,
        second.run_id,
    ]
    assert [r.run_id for r in runs.runs_at_sha(redis_conn, REPO, SHA_B)] == [second.run_id]
    newest = [r.run_id for r in runs.list_runs(redis_conn, limit=2)]
    assert newest == [third.run_id, second.run_id]


def test_an_approval_is_one_commit_and_can_be_voided(redis_conn: Redis) -> None:
    assert runs.approval_for(redis_conn, REPO, 7) is None
    approval = Approval(REPO, 7, SHA_A, "alice", ApprovalVia.LABEL)
    runs.store_approval(redis_conn, approval)
    assert runs.approval_for(redis_conn, REPO, 7) == approval
    assert runs.approval_for(redis_conn, REPO, 8) is None
    newer = Approval(REPO, 7, SHA_B, "wendy", ApprovalVia.BUTTON)
    runs.store_approval(redis_conn, newer)
    assert runs.approval_for(redis_conn, REPO, 7) == newer
    assert runs.void_approvals(redis_conn, REPO, 7) is True
    assert runs.approval_for(redis_conn, REPO, 7) is None
    assert runs.void_approvals(redis_conn, REPO, 7) is False


def test_head_since_is_when_the_head_last_became_the_head(redis_conn: Redis) -> None:
    """M opened at 100, pushed to A at 200, force-pushed back to M at 300: M has been the head
    since 300, not 100; an old event handled again moves nothing back."""
    runs.note_head(redis_conn, REPO, 7, SHA_A, 100.0)
    runs.note_head(redis_conn, REPO, 7, SHA_B, 200.0)
    assert runs.head_since(redis_conn, REPO, 7, SHA_B, now=250.0) == 200.0
    runs.note_head(redis_conn, REPO, 7, SHA_A, 300.0)
    runs.note_head(redis_conn, REPO, 7, SHA_A, 100.0)  # the opened event, redelivered
    assert runs.head_since(redis_conn, REPO, 7, SHA_A, now=400.0) == 300.0
    assert runs.heads(redis_conn, REPO, 7) == {SHA_A: 300.0, SHA_B: 200.0}
    assert runs.heads(redis_conn, REPO, 8) == {}


def test_a_head_gpuci_cannot_vouch_for_is_new_since_now(redis_conn: Redis) -> None:
    """The PR's head is one gpuci saw leave (its push back not yet handled) or never saw."""
    runs.note_head(redis_conn, REPO, 7, SHA_A, 100.0)
    runs.note_head(redis_conn, REPO, 7, SHA_B, 200.0)
    assert runs.head_since(redis_conn, REPO, 7, SHA_A, now=500.0) == 500.0  # back to A, unseen
    assert runs.head_since(redis_conn, REPO, 7, SHA_A, now=600.0) == 500.0  # recorded
    runs.note_head(redis_conn, REPO, 7, SHA_A, 300.0)  # its webhook, late: the time stays
    assert runs.head_since(redis_conn, REPO, 7, SHA_A, now=700.0) == 500.0
    other = "c" * 40
    assert runs.head_since(redis_conn, REPO, 9, other, now=800.0) == 800.0


def test_command_run_times_cover_the_last_hour(redis_conn: Redis) -> None:
    runs.record_command_runs(redis_conn, REPO, 7, ["1", "2"])
    key = f"gpuci:command-runs:{REPO}#7"
    redis_conn.zadd(key, {"old": time.time() - 2 * runs.COMMAND_WINDOW_S})
    times = runs.command_run_times(redis_conn, REPO, 7)
    assert len(times) == 2 and all(t > time.time() - 60 for t in times)
    assert runs.command_run_times(redis_conn, REPO, 8) == []


def test_check_records_say_created_attempted_or_unknown(redis_conn: Redis) -> None:
    name = "gpuci / batch 2"
    assert runs.recorded_check(redis_conn, REPO, SHA_A, name, "1:queued") is None
    runs.record_check(redis_conn, REPO, SHA_A, name, "1:queued", runs.ATTEMPT)
    assert runs.recorded_check(redis_conn, REPO, SHA_A, name, "1:queued") == runs.ATTEMPT
    runs.record_check(redis_conn, REPO, SHA_A, name, "1:queued", 5012)
    assert runs.recorded_check(redis_conn, REPO, SHA_A, name, "1:queued") == 5012
    assert runs.recorded_check(redis_conn, REPO, SHA_B, name, "1:queued") is None
