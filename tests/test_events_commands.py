"""`/gpuci` comments, the "Approve and run" button and Re-run, end to end through fakehub."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bot import runs
from bot.github_app import GitHubApp
from bot.redeliver import redeliver_failed
from bot.runs import RunState
from contract.settings import Settings
from tests.conftest import Stack
from tests.test_events import (
    AUTO,
    LABEL,
    REPO,
    assert_approval_needed,
    assert_queued,
    fork_pr,
    label,
    states,
)


def comment(stack: Stack, number: int, user: str, body: str) -> Any:
    found = stack.control("POST", f"pulls/{REPO}/{number}/comments", {"user": user, "body": body})
    stack.process()
    return found["comment"]


def replies(stack: Stack, number: int) -> list[str]:
    return [c["body"] for c in stack.comments(number) if c["user"] == "gpuci[bot]"]


def reactions(stack: Stack, comment_id: int) -> list[str]:
    found = next(c for c in stack.state()["comments"] if c["id"] == comment_id)
    return [f"{r['user']}:{r['content']}" for r in found["reactions"]]


def test_button_click_by_a_maintainer_runs_the_auto_batches(stack: Stack) -> None:
    pr = fork_pr(stack)
    check = stack.checks(pr["head_sha"])[AUTO[0]]
    stack.control(
        "POST",
        f"check-runs/{check['id']}/requested-action",
        {"user": "wendy", "identifier": "approve"},
    )
    stack.process()
    assert_queued(stack, pr["head_sha"])
    approval = runs.approval_for(stack.redis, REPO, pr["number"])
    assert approval is not None and (approval.approver, approval.via) == ("wendy", "button")


def test_button_click_by_a_reader_is_refused(stack: Stack) -> None:
    pr = fork_pr(stack)
    check = stack.checks(pr["head_sha"])[AUTO[0]]
    stack.control(
        "POST",
        f"check-runs/{check['id']}/requested-action",
        {"user": "rita", "identifier": "approve"},
    )
    stack.process()
    assert_approval_needed(stack, pr["head_sha"])
    [reply] = replies(stack, pr["number"])
    assert "@rita" in reply and "needs write access" in reply


def test_run_command_by_a_maintainer_on_a_fork_approves_and_runs_it(stack: Stack) -> None:
    """The command approves the head: batch 10 runs, and so do the automatic batches, whose
    checks leave action_required (no "Approve and run" button left that does nothing)."""
    pr = fork_pr(stack)
    sent = comment(stack, pr["number"], "alice", "LGTM\n/gpuci run batch 10")
    assert reactions(stack, sent["id"]) == ["gpuci[bot]:eyes"]
    assert_queued(stack, pr["head_sha"], [*AUTO, "gpuci / batch 10"])
    assert all(not c.get("actions") for c in stack.checks(pr["head_sha"]).values())
    sha = pr["head_sha"][:7]
    assert states(stack, pr["number"]) == {
        ("2", sha): "pending",
        ("5", sha): "pending",
        ("10", sha): "pending",
    }
    pending = runs.pending_runs(stack.redis)
    assert {(r.batch, r.trigger, r.requested_by) for r in pending} == {
        (batch, "command", "alice") for batch in ("2", "5", "10")
    }
    approval = runs.approval_for(stack.redis, REPO, pr["number"])
    assert approval is not None and approval.via == "command"
    assert {r.approval_text.split(" (")[0] for r in pending} == {"Approved by alice"}
    assert replies(stack, pr["number"]) == []


def test_unknown_batch_gets_a_reply_listing_the_valid_ones(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    comment(stack, pr["number"], "wendy", "/gpuci run batch 7")
    [reply] = replies(stack, pr["number"])
    assert "Unknown batch `7`" in reply
    assert "Valid batches: `2`, `5`, `10`" in reply


def test_command_by_a_reader_is_refused_naming_write_access(stack: Stack) -> None:
    pr = fork_pr(stack)
    sent = comment(stack, pr["number"], "rita", "/gpuci run all")
    [reply] = replies(stack, pr["number"])
    assert reply.startswith("@rita: `/gpuci` commands need write access")
    assert "(yours: `read`)" in reply
    assert reactions(stack, sent["id"]) == []  # the reply is the answer: no 👀, one call less
    assert runs.pending_runs(stack.redis) == []
    assert runs.approval_for(stack.redis, REPO, pr["number"]) is None


def test_help_lists_commands_and_batches(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    comment(stack, pr["number"], "alice", "/gpuci help")
    [reply] = replies(stack, pr["number"])
    assert "`/gpuci run batch NAME [NAME ...]`" in reply
    assert "Batches: `2`, `5`, `10`" in reply
    assert "- `2`: `2`, `5`" in reply  # layer 2


def test_commands_in_code_blocks_and_quotes_are_not_read(stack: Stack) -> None:
    pr = fork_pr(stack)
    body = "To run it, write:\n```\n/gpuci run all\n```\n> /gpuci approve\n`/gpuci run all`"
    sent = comment(stack, pr["number"], "alice", body)
    assert reactions(stack, sent["id"]) == []
    assert replies(stack, pr["number"]) == []
    assert runs.approval_for(stack.redis, REPO, pr["number"]) is None


def test_the_bots_own_comments_are_ignored(stack: Stack) -> None:
    pr = fork_pr(stack)
    sent = comment(stack, pr["number"], "gpuci[bot]", "/gpuci run all")
    assert reactions(stack, sent["id"]) == []
    assert runs.pending_runs(stack.redis) == []
    comment(stack, pr["number"], "alice", "/gpuci help")  # the reply is delivered back to gpuci
    [bot_reply] = [c for c in stack.comments(pr["number"]) if c["body"].startswith("**gpuci")]
    assert bot_reply["reactions"] == []
    assert len(replies(stack, pr["number"])) == 2  # the one above and the help, nothing more


def test_status_lists_the_prs_runs(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    comment(stack, pr["number"], "wendy", "/gpuci status")
    [reply] = replies(stack, pr["number"])
    assert f"(head `{pr['head_sha'][:12]}`)" in reply
    assert f"| `2` | `{pr['head_sha'][:10]}` | pending | waiting for a GPU host |" in reply
    assert f"| `5` | `{pr['head_sha'][:10]}` | pending |" in reply


def test_cancel_command_cancels_the_prs_runs(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    comment(stack, pr["number"], "wendy", "/gpuci cancel")
    assert runs.pending_runs(stack.redis) == []
    for check in stack.checks(pr["head_sha"]).values():
        assert check["conclusion"] == "cancelled"
        assert "comment by @wendy" in check["output"]["summary"]


def test_command_runs_are_rate_limited_per_pr(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    earlier = [f"old-{i}" for i in range(20)]  # 20 command runs in the last hour
    runs.record_command_runs(stack.redis, REPO, pr["number"], earlier)
    comment(stack, pr["number"], "alice", "/gpuci run batch 10")
    [reply] = replies(stack, pr["number"])
    assert "Too many command-triggered runs" in reply
    assert "10" not in {r.batch for r in runs.pending_runs(stack.redis)}


def complete(stack: Stack, number: int, batch: str, conclusion: str) -> runs.Run:
    """What a GPU worker will do: finish the PR's run of `batch`."""
    run = next(r for r in runs.runs_of_pr(stack.redis, REPO, number) if r.batch == batch)
    return runs.update_run(stack.redis, run, state=RunState.COMPLETED, conclusion=conclusion)


def test_rerun_failed_runs_the_failed_batches_again(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    complete(stack, pr["number"], "2", "failure")
    complete(stack, pr["number"], "5", "success")
    comment(stack, pr["number"], "wendy", "/gpuci rerun failed")
    [pending] = runs.pending_runs(stack.redis)
    assert (pending.batch, pending.trigger) == ("2", "command")


def test_rerequested_check_runs_its_batch_again(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    done = complete(stack, pr["number"], "5", "failure")
    stack.control("POST", f"check-runs/{done.check_run_id}/rerequest", {"user": "alice"})
    stack.process()
    rerun = [r for r in runs.pending_runs(stack.redis) if r.batch == "5"]
    assert [(r.trigger, r.requested_by) for r in rerun] == [("rerun", "alice")]
    assert stack.checks(pr["head_sha"])["gpuci / batch 5"]["external_id"] == rerun[0].run_id


def test_check_suite_rerequest_reruns_the_suites_batches(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    complete(stack, pr["number"], "2", "failure")
    complete(stack, pr["number"], "5", "failure")
    opened = stack.state()["deliveries"][0]["payload"]  # fakehub sends no check_suite events
    payload = {
        "action": "rerequested",
        "check_suite": {"id": 1, "head_sha": pr["head_sha"], "pull_requests": []},
        "repository": opened["repository"],
        "installation": opened["installation"],
        "sender": opened["sender"],
    }
    stack.deliver("check_suite", payload, "suite-1")
    stack.process()
    assert sorted(r.batch for r in runs.pending_runs(stack.redis)) == ["2", "5"]
    assert_queued(stack, pr["head_sha"])


# --- a command approves only a head that has been the head since before it was written ------


def force_push(stack: Stack, number: int, sha: str) -> None:
    """`git push --force` of a commit the PR had before: fakehub's control API pushes only new
    commits, so this moves the head in its world and sends the `synchronize` as it does."""
    from fakehub import webhooks
    from fakehub.world import timestamp

    world = stack.hub.world
    with world.lock:
        pr = world.pulls[(REPO, number)]
        before, pr.head_sha, pr.updated_at = pr.head_sha, sha, timestamp()
        world.repos[str(pr.head_repo)].branches[pr.head_ref] = sha
        payload = webhooks.pull_request_event(
            world, pr, "synchronize", pr.author, stack.hub.url, before=before
        )
    assert webhooks.emit(world, "pull_request", payload) is not None


def next_second() -> None:
    """GitHub's timestamps have whole seconds: what follows happens in a later one."""
    time.sleep(1.05 - time.time() % 1)


@pytest.mark.parametrize("push_seen_first", [True, False])
def test_a_command_written_before_a_force_push_back_approves_nothing(
    stack: Stack, push_seen_first: bool
) -> None:
    """Fork PR opened at M, pushed to a benign A, `/gpuci approve` by a maintainer (meant for
    A), force-pushed back to M; the comment is handled only after that, through GitHub's
    redelivery of a delivery gpuci missed, with the push's webhook handled before it (or not
    yet). M was the head before, but not since the comment: nothing is approved, nothing
    runs, and the reply says why and what to do."""
    pr = fork_pr(stack)
    number, m_sha = pr["number"], pr["head_sha"]
    next_second()
    a_sha = stack.control("POST", f"pulls/{REPO}/{number}/push", {"files": {"ok.py": "1\n"}})["sha"]
    stack.process()
    next_second()
    since = time.time() - 60
    world = stack.hub.world
    webhook_url, world.app.webhook_url = world.app.webhook_url, "http://127.0.0.1:9/webhook"
    try:  # gpuci misses the comment's delivery (no answer: GitHub will offer a redelivery)
        body = {"user": "alice", "body": "/gpuci approve"}
        sent = stack.control("POST", f"pulls/{REPO}/{number}/comments", body)
        assert sent["delivery"]["status_code"] == 0
    finally:
        world.app.webhook_url = webhook_url
    next_second()
    if push_seen_first:
        force_push(stack, number, m_sha)
        stack.process()
    else:  # the push's webhook is late: gpuci sees M only in the PR it fetches
        with world.lock:
            world.pulls[(REPO, number)].head_sha = m_sha
    app = GitHubApp.from_settings(Settings.from_env())
    assert redeliver_failed(app, stack.redis, since) == [sent["delivery"]["guid"]]
    stack.process()

    assert runs.approval_for(stack.redis, REPO, number) is None
    assert runs.pending_runs(stack.redis) == []
    assert {r.state for r in runs.runs_of_pr(stack.redis, REPO, number) if r.sha == m_sha} <= {
        RunState.AWAITING_APPROVAL,
        RunState.CANCELLED,
    }
    [reply] = replies(stack, number)
    assert f"Not approved: `{m_sha[:12]}` has been the head only since" in reply
    assert "after your comment" in reply and f"`/gpuci approve {m_sha}`" in reply
    assert a_sha != m_sha
    if not push_seen_first:  # the webhook comes: M is still not approved by the old comment
        force_push(stack, number, m_sha)
        stack.process()
        assert runs.approval_for(stack.redis, REPO, number) is None


def test_approve_with_the_full_sha_approves_that_commit_whenever_it_became_the_head(
    stack: Stack,
) -> None:
    """The explicit form: the maintainer names the commit, so a push back to it before the
    comment is handled does not matter; a prefix of an older head approves nothing."""
    pr = fork_pr(stack)
    number, m_sha = pr["number"], pr["head_sha"]
    next_second()
    a_sha = stack.control("POST", f"pulls/{REPO}/{number}/push", {"files": {"ok.py": "1\n"}})["sha"]
    stack.process()
    comment(stack, number, "alice", f"/gpuci approve {m_sha[:9]}")
    [reply] = replies(stack, number)
    assert f"`{m_sha[:9]}` is not the head commit; the head is `{a_sha[:12]}`" in reply
    next_second()
    force_push(stack, number, m_sha)
    stack.process()
    comment(stack, number, "alice", f"/gpuci approve {m_sha}")
    approval = runs.approval_for(stack.redis, REPO, number)
    assert approval is not None and (approval.sha, approval.approver) == (m_sha, "alice")
    assert {(r.batch, r.sha) for r in runs.pending_runs(stack.redis)} == {
        ("2", m_sha),
        ("5", m_sha),
    }


@pytest.mark.parametrize("how", ["button", "label"])
def test_on_a_head_approved_by_a_command_the_button_and_the_label_run_the_rest(
    stack: Stack, how: str
) -> None:
    """`/gpuci approve` approved the head; batch 2 completed there, batch 5 was cancelled. The
    "Approve and run" button still shown on the first check, or the label, does not answer
    "already approved" and do nothing: batch 5 runs again, batch 2 does not."""
    pr = fork_pr(stack)
    number, sha = pr["number"], pr["head_sha"]
    button = stack.checks(sha)[AUTO[1]]  # action_required, with the button
    comment(stack, number, "alice", "/gpuci approve")
    complete(stack, number, "2", "success")
    comment(stack, number, "alice", "/gpuci cancel")
    assert runs.pending_runs(stack.redis) == []
    if how == "button":
        stack.control(
            "POST",
            f"check-runs/{button['id']}/requested-action",
            {"user": "wendy", "identifier": "approve"},
        )
    else:
        label(stack, number, "wendy", add=LABEL)
    stack.process()
    [again] = runs.pending_runs(stack.redis)
    assert (again.batch, again.sha, again.requested_by) == ("5", sha, "wendy")
    assert again.approval_text.startswith("Approved by alice (command, ")
    assert_queued(stack, sha, [AUTO[1]])
    assert stack.checks(sha)[AUTO[1]]["external_id"] == again.run_id
    approval = runs.approval_for(stack.redis, REPO, number)
    assert approval is not None and (approval.approver, approval.via) == ("alice", "command")
