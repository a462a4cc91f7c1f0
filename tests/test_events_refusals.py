"""What gpuci refuses to run, and how it says so, end to end through fakehub: edited comments,
pull requests whose head repository was deleted, and outsiders' commands (with what each costs
in GitHub API calls, from fakehub's request log)."""

from __future__ import annotations

from typing import Any

from bot import runs
from tests.conftest import Stack
from tests.test_events import AUTO, LABEL, REPO, assert_approval_needed, fork_pr, label, states


def comment(stack: Stack, number: int, user: str, body: str) -> Any:
    found = stack.control("POST", f"pulls/{REPO}/{number}/comments", {"user": user, "body": body})
    stack.process()
    return found["comment"]


def bot_replies(stack: Stack, number: int) -> list[str]:
    return [c["body"] for c in stack.comments(number) if c["user"] == "gpuci[bot]"]


def api_calls(stack: Stack) -> list[str]:
    """The GitHub API calls made since the log was last cleared, as "METHOD operation"."""
    logged = stack.control("GET", "requests")["requests"]
    return [f"{r['method']} {r['operation']}" for r in logged]


APP_LOOKUP = "GET apps/get-authenticated"


def clear_calls(stack: Stack) -> None:
    stack.control("DELETE", "requests")


# --- an edited comment -----------------------------------------------------------------------


def test_an_edited_comment_runs_nothing_and_costs_no_api_call(stack: Stack) -> None:
    """Editing a comment into `/gpuci approve` (by its author, a maintainer) approves and runs
    nothing: only new comments are read, so a command cannot be slipped into an old comment
    written before the head it would approve."""
    pr = fork_pr(stack)
    said = comment(stack, pr["number"], "alice", "looks interesting")
    clear_calls(stack)
    edited = stack.control("PATCH", f"comments/{said['id']}", {"body": "/gpuci approve"})
    assert edited["delivery"]["status_code"] == 202
    stack.process()
    assert api_calls(stack) == []
    assert runs.approval_for(stack.redis, REPO, pr["number"]) is None
    assert runs.pending_runs(stack.redis) == []
    assert bot_replies(stack, pr["number"]) == []
    assert_approval_needed(stack, pr["head_sha"])


# --- a deleted head repository ---------------------------------------------------------------


def assert_head_gone_checks(stack: Stack, sha: str) -> None:
    checks = stack.checks(sha)
    assert sorted(checks) == AUTO
    for check in checks.values():
        assert (check["status"], check["conclusion"]) == ("completed", "cancelled")
        assert check["output"]["title"] == "Not run: the head repository was deleted"
        assert "no one can push to it" in check["output"]["summary"]
        assert not check.get("actions")  # no "Approve and run" button left


def test_a_pr_whose_fork_was_deleted_runs_nothing_and_says_why(stack: Stack) -> None:
    pr = fork_pr(stack)
    number, sha = pr["number"], pr["head_sha"]
    assert_approval_needed(stack, sha)
    stack.control("POST", "repos/ossie/gpu/delete", {})

    label(stack, number, "alice", add=LABEL)  # a maintainer approves: GitHub sends head.repo null
    stack.process()
    assert runs.pending_runs(stack.redis) == []
    assert runs.approval_for(stack.redis, REPO, number) is None
    assert_head_gone_checks(stack, sha)
    assert set(states(stack, number).values()) == {"cancelled"}
    assert len([c for c in stack.state()["check_runs"] if c["head_sha"] == sha]) == len(AUTO)

    comment(stack, number, "alice", "/gpuci run all")
    [reply] = bot_replies(stack, number)
    assert "head repository of this PR was deleted" in reply and f"pull/{number}/head" in reply
    check = stack.checks(sha)[AUTO[0]]
    stack.control(
        "POST", f"check-runs/{check['id']}/rerequest", {"user": "alice"}
    )  # Re-run: nothing either
    stack.process()
    assert runs.pending_runs(stack.redis) == []
    assert_head_gone_checks(stack, sha)
    assert len([c for c in stack.state()["check_runs"] if c["head_sha"] == sha]) == len(AUTO)


def test_runs_approved_before_the_fork_was_deleted_are_cancelled(stack: Stack) -> None:
    pr = fork_pr(stack)
    number, sha = pr["number"], pr["head_sha"]
    comment(stack, number, "alice", "/gpuci approve")
    assert {r.batch for r in runs.pending_runs(stack.redis)} == {"2", "5"}
    stack.control("POST", "repos/ossie/gpu/delete", {})

    comment(stack, number, "wendy", "/gpuci status")  # any event about the PR shows it
    assert runs.pending_runs(stack.redis) == []
    assert set(states(stack, number).values()) == {"cancelled"}
    assert runs.approval_for(stack.redis, REPO, number) is None
    assert_head_gone_checks(stack, sha)


# --- outsiders' commands ---------------------------------------------------------------------


def test_outsiders_commands_cost_few_calls_and_one_reply(stack: Stack) -> None:
    """Five `/gpuci` comments from the fork's author: one role lookup and one reply, then
    nothing (the role below write is remembered a minute, the reply an hour per PR)."""
    pr = fork_pr(stack)
    clear_calls(stack)
    for n in range(5):
        comment(stack, pr["number"], "ossie", f"/gpuci run all please ({n})")
    calls = api_calls(stack)
    assert calls.count(APP_LOOKUP) <= 1  # the App's own login, once per process
    assert [c for c in calls if c != APP_LOOKUP] == [
        "GET repos/get-collaborator-permission-level",
        "POST issues/create-comment",
    ]
    [reply] = bot_replies(stack, pr["number"])
    assert "@ossie" in reply and "need write access" in reply and "`none`" in reply
    assert runs.pending_runs(stack.redis) == []
    assert all(not c["reactions"] for c in stack.comments(pr["number"]))

    clear_calls(stack)  # another user without write access is answered once too
    for _ in range(2):
        comment(stack, pr["number"], "rita", "/gpuci approve")
    assert len([c for c in api_calls(stack) if c != APP_LOOKUP]) == 2
    assert len(bot_replies(stack, pr["number"])) == 2
    assert runs.approval_for(stack.redis, REPO, pr["number"]) is None


def test_a_refusal_handled_again_replies_once_and_writers_roles_are_asked_each_time(
    stack: Stack,
) -> None:
    from rq import Queue

    pr = fork_pr(stack)
    comment(stack, pr["number"], "ossie", "/gpuci run all")
    [sent] = [d for d in stack.state()["deliveries"] if d["event"] == "issue_comment"][:1]
    Queue("gpuci-events", connection=stack.redis).enqueue(
        "bot.events.handle_delivery", "issue_comment", sent["guid"], sent["payload"]
    )
    stack.process()
    assert len(bot_replies(stack, pr["number"])) == 1

    clear_calls(stack)
    comment(stack, pr["number"], "wendy", "/gpuci status")
    comment(stack, pr["number"], "wendy", "/gpuci status")
    role_calls = [c for c in api_calls(stack) if "collaborator-permission" in c]
    assert len(role_calls) >= 2  # a writer's role is never taken from a cache
