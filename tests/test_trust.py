"""The trust policy: who may make gpuci run which commit, and what each event makes it do."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from bot.trust import (
    APPROVE_ACTION_ID,
    Actor,
    Approval,
    ApprovalVia,
    CheckRunAction,
    CommentEvent,
    Decision,
    Effect,
    PullRequest,
    PullRequestEvent,
    Role,
    RunRequest,
    Trust,
    classify_pr,
    decide_button,
    decide_command,
    decide_pull_request,
)
from contract.roles import is_sha, role_from_api
from fakehub.schema import webhook_examples

REPO, FORK = "org/proj", "someone/proj"
HEAD, OLD = "b" * 40, "a" * 40
LABEL = "gpuci/approved"
AUTO = ("2", "5")
BATCHES = ("2", "4a", "5", "10")
LAYERS = {"2": AUTO, "3": BATCHES}
APP = "gpuci-app[bot]"

NONE, READ, TRIAGE, WRITE = Role.NONE, Role.READ, Role.TRIAGE, Role.WRITE
MAINTAIN, ADMIN = Role.MAINTAIN, Role.ADMIN
TRUSTED, NEEDS, APPROVED = Trust.TRUSTED, Trust.NEEDS_APPROVAL, Trust.APPROVED
DENIED, IGNORED = Trust.DENIED, Trust.IGNORED
CANCEL, STALE, VOID = Effect.CANCEL_RUNS, Effect.CANCEL_STALE_RUNS, Effect.VOID_APPROVALS
UNLABEL, STORE = Effect.REMOVE_LABEL, Effect.STORE_APPROVAL
RESET, EYES = Effect.RESET_CHECKS_TO_ACTION_REQUIRED, Effect.REACT_EYES
STATUS, REPLY = Effect.POST_STATUS, Effect.REPLY


def make_pr(
    fork: bool = False, draft: bool = False, state: str = "open", labels: tuple[str, ...] = ()
) -> PullRequest:
    head_repo = FORK if fork else REPO
    return PullRequest(REPO, 7, HEAD, head_repo, REPO, "author", draft, state, labels)


def approval_of(sha: str | None) -> Approval | None:
    return None if sha is None else Approval(REPO, 7, sha, "maint", ApprovalVia.BUTTON)


def decide(
    event: str,
    author: Role,
    fork: bool,
    draft: bool,
    actor: Role,
    approved: str | None,
    text: str,
) -> Decision:
    """Run one table row through the decide_* function its event belongs to."""
    labels = (LABEL,) if approved else ()
    pr = make_pr(fork=fork, draft=draft, labels=labels)
    return _decide_for(pr, event, actor, approval_of(approved), text, author=author)


# event, PR author's role, fork?, draft?, actor's role (sender/commenter/clicker), stored
# approval's SHA, label/comment body/check SHA -> trust, effects in order, batches run.
POLICY = [
    # A PR is opened: same-repo writers run at once; everyone else waits for approval.
    ("opened", WRITE, False, False, NONE, None, "", TRUSTED, (), AUTO),
    ("opened", MAINTAIN, False, False, NONE, None, "", TRUSTED, (), AUTO),
    ("opened", ADMIN, False, False, NONE, None, "", TRUSTED, (), AUTO),
    ("opened", READ, False, False, NONE, None, "", NEEDS, (RESET,), None),
    ("opened", TRIAGE, False, False, NONE, None, "", NEEDS, (RESET,), None),
    ("opened", NONE, False, False, NONE, None, "", NEEDS, (RESET,), None),
    ("opened", ADMIN, True, False, NONE, None, "", NEEDS, (RESET,), None),
    ("opened", WRITE, True, False, NONE, None, "", NEEDS, (RESET,), None),
    ("opened", NONE, True, False, NONE, None, "", NEEDS, (RESET,), None),
    ("opened", WRITE, False, True, NONE, None, "", TRUSTED, (), None),
    ("opened", NONE, True, True, NONE, None, "", NEEDS, (), None),
    ("reopened", NONE, True, False, NONE, HEAD, "", APPROVED, (), AUTO),
    ("reopened", NONE, True, False, NONE, OLD, "", NEEDS, (RESET,), None),
    ("ready_for_review", WRITE, False, False, NONE, None, "", TRUSTED, (), AUTO),
    ("ready_for_review", NONE, True, False, NONE, HEAD, "", APPROVED, (), AUTO),
    ("ready_for_review", READ, True, False, NONE, None, "", NEEDS, (RESET,), None),
    # A push: older runs cancelled, approvals void, label removed, check back to approval.
    ("synchronize", WRITE, False, False, WRITE, None, "", TRUSTED, (STALE, VOID), AUTO),
    ("synchronize", ADMIN, False, False, NONE, OLD, "", TRUSTED, (STALE, VOID, UNLABEL), AUTO),
    ("synchronize", NONE, True, False, NONE, OLD, "", NEEDS, (STALE, VOID, UNLABEL, RESET), None),
    ("synchronize", NONE, True, False, NONE, HEAD, "", NEEDS, (STALE, VOID, UNLABEL, RESET), None),
    ("synchronize", READ, False, False, NONE, None, "", NEEDS, (STALE, VOID, RESET), None),
    ("synchronize", NONE, True, True, NONE, None, "", NEEDS, (STALE, VOID), None),
    # The approval label counts only when its sender has write+; it approves the head SHA.
    ("labeled", NONE, True, False, WRITE, None, LABEL, APPROVED, (STORE,), AUTO),
    ("labeled", READ, False, False, MAINTAIN, None, LABEL, APPROVED, (STORE,), AUTO),
    ("labeled", NONE, True, False, ADMIN, OLD, LABEL, APPROVED, (STORE,), AUTO),
    ("labeled", NONE, True, True, WRITE, None, LABEL, APPROVED, (STORE,), None),
    ("labeled", NONE, True, False, WRITE, HEAD, LABEL, APPROVED, (), AUTO),  # approved before
    ("labeled", WRITE, False, False, WRITE, None, LABEL, TRUSTED, (), None),
    ("labeled", NONE, True, False, READ, None, LABEL, DENIED, (UNLABEL, REPLY), None),
    ("labeled", NONE, True, False, TRIAGE, None, LABEL, DENIED, (UNLABEL, REPLY), None),
    ("labeled", NONE, True, False, NONE, OLD, LABEL, DENIED, (UNLABEL, REPLY), None),
    ("labeled", NONE, True, False, WRITE, None, "bug", IGNORED, (), None),
    # Removing the label: a writer revokes the approval; anyone else changes nothing.
    ("unlabeled", NONE, True, False, WRITE, HEAD, LABEL, NEEDS, (CANCEL, VOID, RESET), None),
    ("unlabeled", NONE, True, False, TRIAGE, HEAD, LABEL, IGNORED, (), None),
    ("unlabeled", WRITE, False, False, ADMIN, None, LABEL, IGNORED, (), None),
    ("unlabeled", NONE, True, False, ADMIN, HEAD, "bug", IGNORED, (), None),
    ("closed", WRITE, False, False, WRITE, None, "", IGNORED, (CANCEL,), None),
    ("closed", NONE, True, False, NONE, HEAD, "", IGNORED, (CANCEL,), None),
    # Commands: write+ only; on an untrusted PR a run or approve approves the head SHA.
    ("comment", NONE, True, False, WRITE, None, "/gpuci run batch 10", APPROVED,
     (EYES, STORE), ("2", "5", "10")),  # an approval runs the automatic batches too
    ("comment", NONE, True, True, WRITE, None, "/gpuci run batch 10", APPROVED,
     (EYES, STORE), ("10",)),  # a draft has no automatic runs
    ("comment", READ, False, False, MAINTAIN, None, "/gpuci approve", APPROVED,
     (EYES, STORE), AUTO),
    ("comment", NONE, True, False, ADMIN, OLD, "/gpuci approve", APPROVED, (EYES, STORE), AUTO),
    ("comment", NONE, True, False, WRITE, HEAD, "/gpuci approve", APPROVED, (EYES, REPLY), None),
    ("comment", NONE, True, False, WRITE, HEAD, "/gpuci run layer 2", APPROVED, (EYES,), AUTO),
    ("comment", NONE, True, True, ADMIN, None, "/gpuci run all", APPROVED, (EYES, STORE),
     BATCHES),
    ("comment", WRITE, False, False, WRITE, None, "/gpuci run batch 4a 2", TRUSTED, (EYES,),
     ("2", "4a")),
    ("comment", WRITE, False, False, WRITE, None, "/gpuci approve", TRUSTED, (EYES, REPLY), None),
    ("comment", NONE, True, False, READ, None, "/gpuci run batch 10", DENIED, (EYES, REPLY), None),
    ("comment", WRITE, False, False, TRIAGE, None, "/gpuci run all", DENIED, (EYES, REPLY), None),
    ("comment", NONE, True, False, NONE, None, "/gpuci approve", DENIED, (EYES, REPLY), None),
    ("comment", NONE, True, False, WRITE, None, "/gpuci cancel", NEEDS, (EYES, CANCEL), None),
    ("comment", WRITE, False, False, WRITE, None, "/gpuci status", TRUSTED, (EYES, STATUS), None),
    ("comment", NONE, True, False, WRITE, None, "/gpuci help", NEEDS, (EYES, REPLY), None),
    ("comment", NONE, True, False, WRITE, None, "/gpuci run batch 99", NEEDS, (EYES, REPLY),
     None),
    ("comment", NONE, True, False, WRITE, None, "```\n/gpuci approve\n```", IGNORED, (), None),
    ("comment", NONE, True, False, WRITE, None, "> /gpuci approve", IGNORED, (), None),
    ("comment", NONE, True, False, ADMIN, None, "LGTM, approved", IGNORED, (), None),
    # The "Approve and run" button: write+ approves the head and runs; others are told no.
    ("button", NONE, True, False, WRITE, None, "", APPROVED, (STORE,), AUTO),
    ("button", READ, False, False, ADMIN, OLD, "", APPROVED, (STORE,), AUTO),
    ("button", NONE, True, True, MAINTAIN, None, "", APPROVED, (STORE,), AUTO),
    ("button", NONE, True, False, WRITE, HEAD, "", APPROVED, (), AUTO),  # approved before
    ("button", WRITE, False, False, WRITE, None, "", TRUSTED, (), AUTO),
    ("button", NONE, True, False, READ, None, "", DENIED, (REPLY,), None),
    ("button", NONE, True, False, TRIAGE, None, "", DENIED, (REPLY,), None),
    ("button", NONE, True, False, WRITE, None, OLD, IGNORED, (), None),  # stale check
    # Re-run: never approves; runs the check's batch only when trusted or approved.
    ("rerun", WRITE, False, False, WRITE, None, "", TRUSTED, (), ("5",)),
    ("rerun", NONE, True, False, WRITE, HEAD, "", APPROVED, (), ("5",)),
    ("rerun", NONE, True, False, ADMIN, None, "", NEEDS, (RESET,), None),
    ("rerun", NONE, True, False, WRITE, OLD, "", NEEDS, (RESET,), None),
    ("rerun", WRITE, False, False, READ, None, "", DENIED, (), None),
    ("rerun", WRITE, False, False, WRITE, None, OLD, IGNORED, (), None),  # stale check
]  # fmt: skip


def _row_id(row: tuple[Any, ...]) -> str:
    event, author, fork, draft, actor, approved, text = row[:7]
    parts = [event, f"author-{author}", "fork" if fork else "same", f"by-{actor}"]
    parts += ["draft"] if draft else []
    parts += [f"approved-{'head' if approved == HEAD else 'old'}"] if approved else []
    parts += [text.split("\n")[0][:24]] if text and text not in (HEAD, OLD) else []
    parts += ["stale-check"] if text == OLD else []
    return "|".join(parts)


@pytest.mark.parametrize(
    ("event", "author", "fork", "draft", "actor", "approved", "text", "trust", "effects", "runs"),
    [pytest.param(*row, id=_row_id(row)) for row in POLICY],
)
def test_policy(
    event: str,
    author: Role,
    fork: bool,
    draft: bool,
    actor: Role,
    approved: str | None,
    text: str,
    trust: Trust,
    effects: tuple[Effect, ...],
    runs: tuple[str, ...] | None,
) -> None:
    decision = decide(event, author, fork, draft, actor, approved, text)
    assert decision.trust is trust, decision.summary
    assert decision.effects == effects, decision.summary
    assert (decision.run.batches if decision.run else None) == runs
    if decision.run is not None:
        assert decision.run.sha == HEAD
        assert decision.trust in (TRUSTED, APPROVED)
    if STORE in effects:
        assert decision.approval is not None
        assert (decision.approval.sha, decision.approval.number) == (HEAD, 7)
    if RESET in effects:
        assert "Approve and run" in decision.summary
    assert decision.reasons


def test_policy_table_is_big_and_covers_every_role_and_event() -> None:
    assert len(POLICY) >= 40
    assert {row[0] for row in POLICY} >= {
        "opened",
        "synchronize",
        "labeled",
        "unlabeled",
        "comment",
        "button",
        "ready_for_review",
        "closed",
        "reopened",
        "rerun",
    }
    assert {row[1] for row in POLICY} | {row[4] for row in POLICY} == set(Role)


# --- authorization never comes from author_association, bots, edits or closed PRs ----------


def _examples(name: str) -> list[dict[str, Any]]:
    return [copy.deepcopy(payload) for event, payload in webhook_examples() if event == name]


def _example(name: str, action: str) -> dict[str, Any]:
    return next(e for e in _examples(name) if e.get("action") == action)


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR"])
@pytest.mark.parametrize("role", [NONE, READ, TRIAGE])
def test_author_association_never_authorizes(association: str, role: Role) -> None:
    """GitHub's real payloads say OWNER; what counts is the permission API's role."""
    payload = _example("pull_request", "opened")
    payload["pull_request"]["author_association"] = association
    opened = PullRequestEvent.from_payload(payload)
    assert opened.pr.same_repo
    decision = decide_pull_request(opened, role, None, LABEL, AUTO)
    assert (decision.trust, decision.run) == (NEEDS, None)

    comment = _example("issue_comment", "created")
    comment["comment"]["author_association"] = association
    comment["comment"]["body"] = "/gpuci run all"
    event = CommentEvent.from_payload(comment, opened.pr, APP)
    decision = decide_command(
        event,
        author_role=role,
        commenter_role=role,
        approval=None,
        valid_batches=BATCHES,
        layers=LAYERS,
        auto_batches=AUTO,
    )
    assert (decision.trust, decision.run, decision.approval) == (DENIED, None, None)
    assert decision.reply is not None and "write access" in decision.reply


def _comment_decision(event: CommentEvent, role: Role = ADMIN, **kw: Any) -> Decision:
    kw.setdefault("approval", None)
    return decide_command(
        event,
        author_role=NONE,
        commenter_role=role,
        valid_batches=BATCHES,
        layers=LAYERS,
        auto_batches=AUTO,
        **kw,
    )


@pytest.mark.parametrize(
    "commenter",
    [
        Actor(APP, "Bot"),
        Actor(APP.upper(), "Bot"),
        Actor("dependabot[bot]", "Bot"),
        Actor("some-app[bot]", "User"),
        Actor("gpuci-app", "Bot"),
    ],
)
def test_bot_comments_are_ignored_whatever_their_role(commenter: Actor) -> None:
    event = CommentEvent("created", make_pr(fork=True), commenter, "/gpuci approve", APP)
    decision = _comment_decision(event, ADMIN)
    assert (decision.trust, decision.effects, decision.run) == (IGNORED, (), None)


@pytest.mark.parametrize("action", ["edited", "deleted", "pinned", ""])
def test_only_new_comments_are_read(action: str) -> None:
    event = CommentEvent(action, make_pr(fork=True), Actor("maint"), "/gpuci approve", APP)
    decision = _comment_decision(event, ADMIN)
    assert (decision.trust, decision.effects, decision.run) == (IGNORED, (), None)


@pytest.mark.parametrize("state", ["closed", "merged"])
def test_comments_on_closed_prs_are_ignored(state: str) -> None:
    pr = make_pr(fork=True, state=state)
    event = CommentEvent("created", pr, Actor("maint"), "/gpuci run all", APP)
    decision = _comment_decision(event, ADMIN)
    assert (decision.trust, decision.effects, decision.run) == (IGNORED, (), None)


@pytest.mark.parametrize("role", [WRITE, ADMIN])
def test_button_by_a_bot_is_ignored(role: Role) -> None:
    check = CheckRunAction(
        "requested_action", make_pr(fork=True), HEAD, Actor(APP, "Bot"), "approve"
    )
    decision = decide_button(
        check, author_role=NONE, actor_role=role, approval=None, auto_batches=AUTO
    )
    assert (decision.trust, decision.run) == (IGNORED, None)


@pytest.mark.parametrize("label_sender", [Actor(APP, "Bot"), Actor("renovate[bot]", "Bot")])
def test_label_added_by_a_bot_approves_nothing(label_sender: Actor) -> None:
    event = PullRequestEvent("labeled", make_pr(fork=True), label_sender, LABEL)
    decision = decide_pull_request(event, NONE, None, LABEL, AUTO, sender_role=ADMIN)
    assert (decision.trust, decision.run, decision.approval) == (DENIED, None, None)


@pytest.mark.parametrize("event", ["labeled", "button"])
@pytest.mark.parametrize(("approved", "skip_done"), [(None, False), (HEAD, True)])
def test_label_and_button_run_the_auto_batches_as_the_approver(
    event: str, approved: str | None, skip_done: bool
) -> None:
    """The runs are the approver's, not the PR author's; on a head approved before (by a
    command), they run the automatic batches that have not completed there yet."""
    decision = decide(
        event, NONE, True, False, MAINTAIN, approved, LABEL if event == "labeled" else ""
    )
    assert decision.run is not None and decision.run.batches == AUTO
    assert (decision.run.requested_by, decision.run.skip_done) == ("actor", skip_done)
    assert (decision.approval is None) is skip_done


@pytest.mark.parametrize(("fork", "trust"), [(False, TRUSTED), (True, NEEDS)])
def test_without_auto_batches_nothing_runs_and_no_approval_is_asked(
    fork: bool, trust: Trust
) -> None:
    event = PullRequestEvent("opened", make_pr(fork=fork), Actor("author"))
    decision = decide_pull_request(event, WRITE, None, LABEL, ())
    assert (decision.trust, decision.effects, decision.run) == (trust, (), None)


@pytest.mark.parametrize("action", ["opened", "synchronize", "labeled", "reopened"])
def test_events_of_a_closed_pr_run_nothing(action: str) -> None:
    event = PullRequestEvent(action, make_pr(state="closed"), Actor("maint"), LABEL)
    decision = decide_pull_request(event, ADMIN, None, LABEL, AUTO, sender_role=ADMIN)
    assert (decision.trust, decision.effects, decision.run) == (IGNORED, (), None)


# --- commands: the head seen, rate limit, rerun failed, several commands at once -----------


HEAD_TWIN = HEAD[:7] + "c" * 33  # another commit the PR had, with the head's 7-hex prefix


@pytest.mark.parametrize(
    ("body", "since", "known", "approved", "reply_says"),
    [
        ("/gpuci approve", 90.0, (), True, None),
        ("/gpuci approve", 100.0, (), True, None),  # GitHub's timestamps are whole seconds
        ("/gpuci approve", None, (), True, None),
        ("/gpuci approve", 101.0, (), False, "after your comment"),  # pushed after the comment
        ("/gpuci run batch 2", 150.0, (), False, f"comment `/gpuci approve {HEAD}`"),
        (f"/gpuci approve {HEAD[:7]}", 90.0, (OLD,), True, None),
        (f"/gpuci approve {HEAD[:7]}", 150.0, (), False, "after your comment"),
        (f"/gpuci approve {HEAD[:7]}", 90.0, (HEAD_TWIN,), False, "more than one commit"),
        (f"/gpuci approve {HEAD[:12]}", 90.0, (HEAD_TWIN,), True, None),
        (f"/gpuci approve {HEAD}", 150.0, (HEAD_TWIN,), True, None),  # the commit, named
        (f"/gpuci approve {HEAD.upper()}", 150.0, (), True, None),
        (f"/gpuci approve {OLD[:10]}", 90.0, (), False, "`aaaaaaaaaa` is not the head commit"),
        (f"/gpuci approve {OLD}", 90.0, (OLD,), False, f"comment `/gpuci approve {HEAD}`"),
    ],
)
def test_a_command_approves_only_the_head_its_author_saw(
    body: str, since: float | None, known: tuple[str, ...], approved: bool, reply_says: str | None
) -> None:
    """`head_since`: since when the head has been the head without a break; a command
    approves it only if that is no later than the comment, or if it names the full SHA."""
    event = CommentEvent("created", make_pr(fork=True), Actor("maint"), body, APP, created_at=100.0)
    decision = _comment_decision(event, WRITE, head_since=since, known_heads=(HEAD, *known))
    assert (decision.approval is not None) is approved
    assert (decision.run is not None) is approved
    assert decision.trust is (APPROVED if approved else NEEDS)
    if approved:
        assert decision.approval is not None and decision.approval.sha == HEAD
        assert decision.reply is None
    else:
        assert decision.reply is not None and reply_says in decision.reply


@pytest.mark.parametrize(
    ("fork", "body", "runs", "held"),
    [
        (True, "/gpuci run all", AUTO, "`4a`, `10` not run"),  # the approval's batches run
        (True, "/gpuci approve", AUTO, None),
        (False, "/gpuci run batch 10", None, "`10` not run"),
    ],
)
def test_rate_limit_holds_back_what_a_command_names_not_what_an_approval_runs(
    fork: bool, body: str, runs: tuple[str, ...] | None, held: str | None
) -> None:
    event = CommentEvent("created", make_pr(fork=fork), Actor("maint"), body, APP)
    author = NONE if fork else WRITE
    decision = decide_command(
        event,
        author_role=author,
        commenter_role=WRITE,
        approval=None,
        valid_batches=BATCHES,
        layers=LAYERS,
        auto_batches=AUTO,
        runs_allowed=False,
    )
    assert decision.trust is (APPROVED if fork else TRUSTED)
    assert (decision.approval is not None) is fork
    assert (decision.run.batches if decision.run else None) == runs
    if held is None:
        assert decision.reply is None
    else:
        assert (
            decision.reply is not None and "Too many" in decision.reply and held in decision.reply
        )


@pytest.mark.parametrize(
    ("failed", "runs", "reply_says"),
    [(("10", "2"), ("2", "10"), None), ((), None, "No failed batches")],
)
def test_rerun_failed_runs_the_failed_batches(
    failed: tuple[str, ...], runs: tuple[str, ...] | None, reply_says: str | None
) -> None:
    pr = make_pr()
    event = CommentEvent("created", pr, Actor("maint"), "/gpuci rerun failed", APP)
    decision = decide_command(
        event,
        author_role=WRITE,
        commenter_role=WRITE,
        approval=None,
        valid_batches=BATCHES,
        layers=LAYERS,
        auto_batches=AUTO,
        failed_batches=failed,
    )
    assert (decision.run.batches if decision.run else None) == runs
    assert decision.reply is None if reply_says is None else reply_says in (decision.reply or "")


def test_several_commands_in_one_comment() -> None:
    body = "/gpuci cancel\n/gpuci run batch 10\n/gpuci run layer 2\n/gpuci nope\n/gpuci help"
    event = CommentEvent("created", make_pr(fork=True), Actor("maint"), body, APP)
    decision = _comment_decision(event, MAINTAIN)
    assert decision.effects == (EYES, CANCEL, STORE, REPLY)  # cancel before the new run
    assert decision.run == RunRequest(REPO, 7, HEAD, ("2", "5", "10"), "command", "maint")
    assert decision.reply is not None
    assert "Unknown command" in decision.reply and "Valid batches" not in decision.reply
    assert "**gpuci commands**" in decision.reply


# --- the building blocks -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("role_name", "permission", "role", "can_write"),
    [
        ("admin", "admin", ADMIN, True),
        ("maintain", "write", MAINTAIN, True),
        ("write", "write", WRITE, True),
        ("triage", "read", TRIAGE, False),
        ("read", "read", READ, False),
        ("none", "none", NONE, False),
        ("Admin", None, ADMIN, True),
        ("security-reviewer", "write", WRITE, True),  # custom role: the permission decides
        ("auditor", "read", READ, False),
        ("auditor", "owner", NONE, False),
        ("", "admin", ADMIN, True),
        (None, None, NONE, False),
        ("superuser", None, NONE, False),
    ],
)
def test_role_from_api(
    role_name: str | None, permission: str | None, role: Role, can_write: bool
) -> None:
    assert role_from_api(role_name, permission) is role
    assert role.can_write is can_write


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (HEAD, True),
        ("0123456789abcdef" * 2 + "01234567", True),
        (HEAD.upper(), False),
        (HEAD[:39], False),
        (HEAD + "b", False),
        ("g" * 40, False),
        (HEAD[:39] + "\n", False),
        ("main", False),
        ("", False),
        (None, False),
    ],
)
def test_is_sha(value: object, ok: bool) -> None:
    assert is_sha(value) is ok


@pytest.mark.parametrize(
    ("pr", "role", "approval", "trust"),
    [
        (make_pr(), WRITE, None, TRUSTED),
        (PullRequest(REPO, 7, HEAD, "ORG/Proj", REPO, "a"), WRITE, None, TRUSTED),
        (PullRequest(REPO, 7, HEAD, None, REPO, "a"), ADMIN, None, NEEDS),  # deleted fork
        (make_pr(fork=True), ADMIN, approval_of(HEAD), APPROVED),
        (make_pr(fork=True), NONE, approval_of(OLD), NEEDS),
        (make_pr(fork=True), NONE, Approval("org/other", 7, HEAD, "m", ApprovalVia.LABEL), NEEDS),
        (make_pr(fork=True), NONE, Approval(REPO, 8, HEAD, "m", ApprovalVia.LABEL), NEEDS),
        (
            PullRequest(REPO, 7, "main", FORK, REPO, "a"),
            NONE,
            Approval(REPO, 7, "main", "m", ApprovalVia.LABEL),
            NEEDS,
        ),  # not a SHA
    ],
)
def test_classify_pr(pr: PullRequest, role: Role, approval: Approval | None, trust: Trust) -> None:
    assert classify_pr(pr, role, approval) is trust


@pytest.mark.parametrize(
    "kwargs",
    [
        {"effects": (STORE,)},
        {"approval": approval_of(HEAD)},
        {"effects": (REPLY,)},
        {"reply": "hi"},
        {"run": RunRequest(REPO, 7, HEAD, AUTO, "x", "y")},
    ],
)
def test_decision_rejects_inconsistent_effects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Decision(NEEDS, HEAD, ("why",), **kwargs)


def test_types_from_real_payloads() -> None:
    opened = PullRequestEvent.from_payload(_example("pull_request", "opened"))
    pr = opened.pr
    assert (pr.repo, pr.number, pr.author) == ("Codertocat/Hello-World", 2, "Codertocat")
    assert is_sha(pr.head_sha) and pr.same_repo and pr.is_open and not pr.draft
    labeled = PullRequestEvent.from_payload(_example("pull_request", "labeled"))
    assert labeled.label and labeled.sender.login

    comment = CommentEvent.from_payload(_example("issue_comment", "created"), pr, APP)
    assert (comment.commenter, comment.created_at) == (Actor("Codertocat"), 1557933621.0)

    undated = _example("issue_comment", "created")
    undated["comment"]["created_at"] = "yesterday"
    assert CommentEvent.from_payload(undated, pr).created_at is None

    clicked = CheckRunAction.from_payload(_example("check_run", "requested_action"), pr)
    assert (clicked.identifier, clicked.sha) == (
        "lgtm|26764",
        "5bd5f196a46b8222fb7484f05faba41a73cf34bd",
    )
    decision = decide_button(
        clicked, author_role=NONE, actor_role=ADMIN, approval=None, auto_batches=AUTO
    )
    assert decision.trust is IGNORED  # not our button


def test_module_is_pure() -> None:
    """The policy imports no web, Redis, GitHub or process machinery."""
    code = (
        "import sys, bot.trust;"
        "bad = {'flask', 'redis', 'rq', 'github', 'subprocess', 'requests'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


GONE_EFFECTS = (VOID, Effect.SHOW_HEAD_GONE)


@pytest.mark.parametrize(
    ("event", "actor", "text", "effects"),
    [
        ("labeled", ADMIN, LABEL, GONE_EFFECTS),
        ("unlabeled", WRITE, LABEL, GONE_EFFECTS),
        ("ready_for_review", NONE, "", GONE_EFFECTS),
        ("comment", MAINTAIN, "/gpuci approve", (EYES, *GONE_EFFECTS, REPLY)),
        ("comment", ADMIN, "/gpuci run all", (EYES, *GONE_EFFECTS, REPLY)),
        ("button", WRITE, "", GONE_EFFECTS),
        ("rerun", ADMIN, "", GONE_EFFECTS),
    ],
)
def test_a_pr_whose_head_repository_was_deleted_runs_nothing_whoever_asks(
    event: str, actor: Role, text: str, effects: tuple[Effect, ...]
) -> None:
    """GitHub sends `head.repo: null` once the fork is gone: even a maintainer's approval, of
    the head or stored before, runs nothing, and the decision says why."""
    for approved in (None, HEAD):
        pr = PullRequest(REPO, 7, HEAD, None, REPO, "author", labels=(LABEL,))
        assert pr.head_gone and not pr.same_repo
        decided = _decide_for(pr, event, actor, approval_of(approved), text)
        assert (decided.trust, decided.effects, decided.run) == (Trust.HEAD_GONE, effects, None)
        assert decided.approval is None
        assert "head repository of this PR was deleted" in decided.summary
        assert (decided.reply is not None) == (event == "comment")


def test_a_deleted_head_repository_still_refuses_outsiders_commands_first() -> None:
    pr = PullRequest(REPO, 7, HEAD, None, REPO, "author")
    decided = _decide_for(pr, "comment", READ, None, "/gpuci run all")
    assert decided.trust is DENIED and "write access" in (decided.reply or "")


def test_closing_a_pr_whose_head_repository_was_deleted_cancels_its_runs() -> None:
    pr = PullRequest(REPO, 7, HEAD, None, REPO, "author")
    decided = _decide_for(pr, "closed", NONE, None, "")
    assert (decided.trust, decided.effects) == (IGNORED, (CANCEL,))


def _decide_for(
    pr: PullRequest,
    event: str,
    actor: Role,
    approval: Approval | None,
    text: str,
    *,
    author: Role = ADMIN,
) -> Decision:
    """Run one event on `pr` through the decide_* function it belongs to; `text` is the label,
    the comment's body or the clicked check's SHA."""
    who = Actor("actor")
    if event == "comment":
        comment = CommentEvent("created", pr, who, text, APP)
        return decide_command(
            comment,
            author_role=author,
            commenter_role=actor,
            approval=approval,
            valid_batches=BATCHES,
            layers=LAYERS,
            auto_batches=AUTO,
        )
    if event in ("button", "rerun"):
        action = "requested_action" if event == "button" else "rerequested"
        check = CheckRunAction(action, pr, text or HEAD, who, APPROVE_ACTION_ID, batch="5")
        return decide_button(
            check, author_role=author, actor_role=actor, approval=approval, auto_batches=AUTO
        )
    label = text if event in ("labeled", "unlabeled") else None
    pr_event = PullRequestEvent(event, pr, who, label)
    return decide_pull_request(pr_event, author, approval, LABEL, AUTO, sender_role=actor)
