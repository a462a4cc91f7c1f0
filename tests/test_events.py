"""The events worker end to end: fakehub delivers webhooks to gpuci's web app over HTTP, a real
RQ worker handles them, and the Check Runs, comments, labels and Redis runs are what users see."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rq import Queue

from bot import cli, runs
from bot.trust import APPROVE_ACTION_ID, APPROVE_ACTION_LABEL
from tests.conftest import Stack

REPO = "acme/gpu"
AUTO = ["gpuci / batch 2", "gpuci / batch 5"]
LABEL = "gpuci/approved"


def states(stack: Stack, number: int, repo: str = REPO) -> dict[tuple[str, str], str]:
    """(batch, sha[:7]) -> state of the PR's runs (the newest of each wins)."""
    return {(r.batch, r.sha[:7]): str(r.state) for r in runs.runs_of_pr(stack.redis, repo, number)}


def labels(stack: Stack, number: int) -> list[str]:
    pulls = stack.state()["pulls"]
    found = next(p for p in pulls if p["repo"] == REPO and p["number"] == number)
    return list(found["labels"])


def label(stack: Stack, number: int, user: str, **change: str) -> Any:
    return stack.control("POST", f"pulls/{REPO}/{number}/labels", {"user": user, **change})


def fork_pr(stack: Stack) -> Any:
    pr = stack.open_pr("ossie", "fork-change", head_repo="ossie/gpu")
    stack.process()
    return pr


def assert_approval_needed(stack: Stack, sha: str) -> None:
    checks = stack.checks(sha)
    assert sorted(checks) == AUTO
    for check in checks.values():
        assert (check["status"], check["conclusion"]) == ("completed", "action_required")
        assert check["actions"] == [
            {
                "label": APPROVE_ACTION_LABEL,
                "description": "Approve this commit for GPU runs",
                "identifier": APPROVE_ACTION_ID,
            }
        ]
        assert "GPU runs need approval" in check["output"]["summary"]


def assert_queued(stack: Stack, sha: str, names: list[str] = AUTO) -> None:
    checks = stack.checks(sha)
    for name in names:
        assert checks[name]["status"] == "queued", checks[name]
        assert checks[name].get("conclusion") is None


def test_trusted_same_repo_pr_queues_the_auto_batches(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    sha = pr["head_sha"]
    checks = stack.checks(sha)
    assert sorted(checks) == AUTO
    for check in checks.values():
        assert check["status"] == "queued"
        assert check["details_url"] == f"https://gpuci.example.org/runs/{check['external_id']}"
        assert check["output"]["title"] == "Waiting for a GPU host"
    pending = runs.pending_runs(stack.redis)
    assert [(r.batch, r.sha, r.pr, r.trigger) for r in pending] == [
        ("2", sha, pr["number"], "pull_request"),
        ("5", sha, pr["number"], "pull_request"),
    ]
    assert "batches:" in pending[0].config_text  # the default branch's config, kept with the run
    assert [r.check_run_id for r in pending] == [checks[n]["id"] for n in AUTO]


def test_fork_pr_needs_approval_and_nothing_is_pending(stack: Stack) -> None:
    pr = fork_pr(stack)
    assert_approval_needed(stack, pr["head_sha"])
    assert "fork `ossie/gpu`" in stack.checks(pr["head_sha"])[AUTO[0]]["output"]["summary"]
    assert runs.pending_runs(stack.redis) == []
    assert set(states(stack, pr["number"]).values()) == {"awaiting_approval"}


def test_label_from_a_maintainer_approves_that_commit(stack: Stack) -> None:
    pr = fork_pr(stack)
    label(stack, pr["number"], "alice", add=LABEL)
    stack.process()
    assert_queued(stack, pr["head_sha"])
    sha = pr["head_sha"][:7]
    assert states(stack, pr["number"]) == {("2", sha): "pending", ("5", sha): "pending"}
    assert {r.trigger for r in runs.pending_runs(stack.redis)} == {"approval"}
    approval = runs.approval_for(stack.redis, REPO, pr["number"])
    assert approval is not None and (approval.sha, approval.approver) == (pr["head_sha"], "alice")
    assert labels(stack, pr["number"]) == [LABEL]


def test_label_from_triage_approves_nothing_and_is_removed(stack: Stack) -> None:
    pr = fork_pr(stack)
    label(stack, pr["number"], "tracy", add=LABEL)
    stack.process()
    assert labels(stack, pr["number"]) == []
    assert_approval_needed(stack, pr["head_sha"])
    assert runs.pending_runs(stack.redis) == []
    [reply] = stack.comments(pr["number"])
    assert reply["user"] == "gpuci[bot]"
    assert "@tracy" in reply["body"] and "write access" in reply["body"]
    assert "`triage`" in reply["body"]


def test_push_after_approval_voids_it(stack: Stack) -> None:
    pr = fork_pr(stack)
    label(stack, pr["number"], "alice", add=LABEL)
    stack.process()
    old = pr["head_sha"]
    pushed = stack.control("POST", f"pulls/{REPO}/{pr['number']}/push", {"files": {"x.py": "1"}})
    stack.process()
    new = pushed["sha"]
    assert runs.approval_for(stack.redis, REPO, pr["number"]) is None
    assert labels(stack, pr["number"]) == []
    assert_approval_needed(stack, new)
    for check in stack.checks(old).values():  # the approved commit's runs are cancelled
        assert check["conclusion"] == "cancelled"
        assert "Superseded" in check["output"]["summary"]
    assert states(stack, pr["number"]) == {
        ("2", old[:7]): "cancelled",
        ("5", old[:7]): "cancelled",
        ("2", new[:7]): "awaiting_approval",
        ("5", new[:7]): "awaiting_approval",
    }
    assert runs.pending_runs(stack.redis) == []


def test_push_to_a_trusted_pr_moves_its_runs_to_the_new_commit(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    pushed = stack.control("POST", f"pulls/{REPO}/{pr['number']}/push", {"files": {"x.py": "1"}})
    stack.process()
    old, new = pr["head_sha"], pushed["sha"]
    assert {c["conclusion"] for c in stack.checks(old).values()} == {"cancelled"}
    assert_queued(stack, new)
    assert {r.sha for r in runs.pending_runs(stack.redis)} == {new}


def test_other_labels_are_ignored(stack: Stack) -> None:
    pr = fork_pr(stack)
    label(stack, pr["number"], "alice", add="bug")
    stack.process()
    assert labels(stack, pr["number"]) == ["bug"]
    assert runs.pending_runs(stack.redis) == []
    assert stack.comments(pr["number"]) == []


def test_installation_changes_are_recorded(stack: Stack) -> None:
    payload = {
        "action": "added",
        "installation": {"id": 201, "account": {"login": "acme"}},
        "repositories_added": [{"full_name": "acme/new"}],
        "repositories_removed": [],
        "sender": {"login": "alice", "type": "User"},
    }
    stack.deliver("installation_repositories", payload, "inst-1")
    stack.process()
    recorded = {
        k.decode(): v.decode() for k, v in stack.redis.hgetall("gpuci:installation:201").items()
    }
    assert recorded["account"] == "acme"
    assert recorded["action"] == "installation_repositories.added"
    assert json.loads(recorded["repositories"])["repositories_added"] == ["acme/new"]


def test_unlabel_by_a_maintainer_revokes_the_approval(stack: Stack) -> None:
    pr = fork_pr(stack)
    label(stack, pr["number"], "alice", add=LABEL)
    stack.process()
    label(stack, pr["number"], "alice", remove=LABEL)
    stack.process()
    assert runs.approval_for(stack.redis, REPO, pr["number"]) is None
    assert runs.pending_runs(stack.redis) == []
    assert_approval_needed(stack, pr["head_sha"])


def test_draft_pr_runs_nothing_automatically(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature", draft=True)
    stack.process()
    assert stack.checks(pr["head_sha"]) == {}
    assert runs.runs_of_pr(stack.redis, REPO, pr["number"]) == []


def test_closing_a_pr_cancels_its_pending_runs(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    stack.control("POST", f"pulls/{REPO}/{pr['number']}/close", {"user": "alice"})
    stack.process()
    assert runs.pending_runs(stack.redis) == []
    assert set(states(stack, pr["number"]).values()) == {"cancelled"}
    for check in stack.checks(pr["head_sha"]).values():
        assert (check["status"], check["conclusion"]) == ("completed", "cancelled")
        assert "closed by @alice" in check["output"]["summary"]


def test_invalid_config_on_the_default_branch_fails_the_config_check(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature", repo="acme/broken")
    stack.process()
    checks = stack.checks(pr["head_sha"])
    assert sorted(checks) == ["gpuci / config"]
    config = checks["gpuci / config"]
    assert config["conclusion"] == "failure"
    assert "on main is invalid" in config["output"]["title"]
    assert ".gpuci.yml:3: batches.2.timeot: unknown key" in config["output"]["summary"]
    assert runs.runs_of_pr(stack.redis, "acme/broken", pr["number"]) == []


def test_pr_changing_the_config_gets_its_version_validated(stack: Stack) -> None:
    pr = stack.open_pr("alice", "config-invalid")
    stack.process()
    checks = stack.checks(pr["head_sha"])
    config = checks["gpuci / config"]
    assert config["conclusion"] == "failure"
    assert ".gpuci.yml:3: batches.2.gpus:" in config["output"]["summary"]
    assert "validated, not used" in config["output"]["summary"]
    assert_queued(stack, pr["head_sha"])  # runs use the default branch's config


def test_valid_config_change_is_reported_as_such(stack: Stack) -> None:
    pr = stack.open_pr("alice", "config-valid")
    stack.process()
    checks = stack.checks(pr["head_sha"])
    config = checks["gpuci / config"]
    assert (config["conclusion"], config["output"]["title"]) == (
        "success",
        "config change is valid",
    )
    assert sorted(checks) == sorted(["gpuci / config", *AUTO])  # the default branch's batches


def handle_again(stack: Stack) -> tuple[Any, Any]:
    """Run the newest delivery's job once more, as RQ does when a worker died mid-job:
    (fakehub's state before, after)."""
    before = stack.state()
    delivery = before["deliveries"][-1]
    Queue("gpuci-events", connection=stack.redis).enqueue(
        "bot.events.handle_delivery", delivery["event"], delivery["guid"], delivery["payload"]
    )
    stack.process()
    return before, stack.state()


def test_same_delivery_handled_twice_creates_nothing_twice(stack: Stack) -> None:
    pr = fork_pr(stack)
    before, after = handle_again(stack)
    assert after["check_runs"] == before["check_runs"]
    body = "/gpuci run batch 10\n/gpuci run batch 99"
    stack.control("POST", f"pulls/{REPO}/{pr['number']}/comments", {"user": "alice", "body": body})
    stack.process()
    [command] = [d for d in stack.state()["deliveries"] if d["event"] == "issue_comment"][:1]
    Queue("gpuci-events", connection=stack.redis).enqueue(
        "bot.events.handle_delivery", "issue_comment", command["guid"], command["payload"]
    )
    before = stack.state()
    stack.process()
    after = stack.state()
    assert len(after["check_runs"]) == len(before["check_runs"]) == 5  # 2 approvals, 3 queued
    assert after["comments"] == before["comments"]
    assert len(before["comments"]) == 2  # the command and one reply, with one 👀
    assert [r["content"] for r in before["comments"][0]["reactions"]] == ["eyes"]
    assert len(runs.runs_of_pr(stack.redis, REPO, pr["number"])) == 3


def test_create_sent_by_a_worker_that_died_is_found_not_repeated(stack: Stack) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    [opened] = stack.state()["deliveries"]
    sha = pr["head_sha"]
    for name in AUTO:  # as if the worker died between sending the create and recording it
        key = f"gpuci:checks:{REPO}:{sha}:{name}"
        for purpose in stack.redis.hkeys(key):
            stack.redis.hset(key, purpose, runs.ATTEMPT)
    Queue("gpuci-events", connection=stack.redis).enqueue(
        "bot.events.handle_delivery", "pull_request", opened["guid"], opened["payload"]
    )
    stack.process()
    assert len(stack.state()["check_runs"]) == 2


@pytest.mark.parametrize(
    "payload",
    [{}, {"action": "opened"}, {"action": "opened", "pull_request": "nope"}, ["a list"]],
)
def test_malformed_payloads_are_dropped_without_failing_the_job(stack: Stack, payload: Any) -> None:
    queue = Queue("gpuci-events", connection=stack.redis)
    job = queue.enqueue("bot.events.handle_delivery", "pull_request", "d-1", payload)
    stack.process()  # fails the test if the job failed
    assert str(job.latest_result().return_value).startswith("dropped:")  # type: ignore[union-attr]


def test_gpuci_runs_lists_runs_as_json(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    pr = stack.open_pr("alice", "feature")
    stack.process()
    assert cli.main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["batch"], r["pr"], r["sha"], r["state"]) for r in listed] == [
        ("5", pr["number"], pr["head_sha"], "pending"),
        ("2", pr["number"], pr["head_sha"], "pending"),
    ]
    assert cli.main(["runs"]) == 0
    table = capsys.readouterr().out
    assert pr["head_sha"][:10] in table and "waiting for a GPU host" in table
