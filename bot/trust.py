"""Who may run what on the GPU hosts: the trust policy for PRs, labels, commands and buttons.

Pure: an events handler fetches the PR, the roles (collaborator permission API) and the stored
approval, calls one `decide_*` function, then executes `Decision.effects` in order and, last,
enqueues `Decision.run`. `author_association` is never an input: it is not authorization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from bot.commands import (
    Command,
    CommandError,
    CommandKind,
    help_text,
    natural_sorted,
    parse_comment,
)
from bot.timestamps import epoch, iso
from contract.roles import Role, is_sha

APPROVE_ACTION_ID = "approve"  # the check run `requested_action` identifier of the button
APPROVE_ACTION_LABEL = "Approve and run"
APPROVE_ACTION_DESCRIPTION = "Approve this commit for GPU runs"


class Trust(StrEnum):
    """What an event means for running the PR's head commit on GPU hosts."""

    TRUSTED = "trusted"  # same-repo PR by a writer: runs automatically
    NEEDS_APPROVAL = "needs_approval"  # nothing runs until a writer approves the head commit
    APPROVED = "approved"  # a writer approved exactly the head commit: runs
    DENIED = "denied"  # the actor asked for something their role does not allow
    IGNORED = "ignored"  # the event asks nothing of gpuci (bots, edits, other labels, closed)
    HEAD_GONE = "head_gone"  # the PR's head repository was deleted: nothing runs, ever


RUNNABLE = frozenset({Trust.TRUSTED, Trust.APPROVED})


@dataclass(frozen=True)
class Actor:
    """A GitHub account that caused an event; `type` is GitHub's: User, Bot or Organization."""

    login: str
    type: str = "User"

    def is_bot(self, app_login: str = "") -> bool:
        """Bots (any app, and this app's own `<slug>[bot]` login) never drive gpuci."""
        login = self.login.lower()
        return self.type == "Bot" or login.endswith("[bot]") or login == app_login.lower()

    @classmethod
    def from_payload(cls, user: Mapping[str, Any] | None) -> Actor:
        user = user or {}
        return cls(login=str(user.get("login") or ""), type=str(user.get("type") or "User"))


@dataclass(frozen=True)
class PullRequest:
    """The PR as GitHub describes it at the event (webhook payload) or at fetch time (REST)."""

    repo: str  # the base repository, "owner/name"
    number: int
    head_sha: str
    head_repo: str | None  # None when the fork was deleted
    base_repo: str
    author: str
    draft: bool = False
    state: str = "open"
    labels: tuple[str, ...] = ()

    @property
    def same_repo(self) -> bool:
        """The head branch lives in the base repository (not a fork)."""
        return self.head_repo is not None and self.head_repo.lower() == self.base_repo.lower()

    @property
    def is_open(self) -> bool:
        return self.state == "open"

    @property
    def head_gone(self) -> bool:
        """The head repository was deleted (GitHub sends `head.repo: null`, as for a deleted
        fork): nobody can push to the PR any more."""
        return self.head_repo is None

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> PullRequest:
        """From a webhook's `pull_request` object or `GET /repos/{o}/{r}/pulls/{n}`."""
        head, base = data.get("head") or {}, data.get("base") or {}
        base_repo = str((base.get("repo") or {}).get("full_name") or "")
        return cls(
            repo=base_repo,
            number=int(data.get("number") or 0),
            head_sha=str(head.get("sha") or ""),
            head_repo=(head.get("repo") or {}).get("full_name"),
            base_repo=base_repo,
            author=str((data.get("user") or {}).get("login") or ""),
            draft=bool(data.get("draft")),
            state=str(data.get("state") or ""),
            labels=tuple(str(label.get("name")) for label in data.get("labels") or ()),
        )


class ApprovalVia(StrEnum):
    LABEL = "label"
    BUTTON = "button"
    COMMAND = "command"


@dataclass(frozen=True)
class Approval:
    """A writer's approval of exactly one commit of one PR."""

    repo: str
    number: int
    sha: str
    approver: str
    via: ApprovalVia
    at: float = field(default=0.0, compare=False)  # epoch seconds; set when it is stored

    def covers(self, pr: PullRequest, sha: str | None = None) -> bool:
        """Whether this approves `sha` (default: the PR's head) of this very PR."""
        sha = pr.head_sha if sha is None else sha
        return (
            is_sha(sha)
            and self.sha == sha
            and self.number == pr.number
            and self.repo.lower() == pr.repo.lower()
        )


@dataclass(frozen=True)
class PullRequestEvent:
    """`pull_request` webhook: `pr` is the payload's PR (its head at the time of the event)."""

    action: str
    pr: PullRequest
    sender: Actor
    label: str | None = None  # labeled/unlabeled: the label's name

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> PullRequestEvent:
        return cls(
            action=str(payload.get("action") or ""),
            pr=PullRequest.from_payload(payload.get("pull_request") or {}),
            sender=Actor.from_payload(payload.get("sender")),
            label=(payload.get("label") or {}).get("name"),
        )


@dataclass(frozen=True)
class CommentEvent:
    """`issue_comment` on a PR; `pr` is fetched (the payload's issue has no head SHA)."""

    action: str
    pr: PullRequest
    commenter: Actor
    body: str
    app_login: str = ""  # this app's `<slug>[bot]` login
    created_at: float | None = None  # the comment's creation time, epoch seconds

    @classmethod
    def from_payload(
        cls, payload: Mapping[str, Any], pr: PullRequest, app_login: str = ""
    ) -> CommentEvent:
        comment = payload.get("comment") or {}
        return cls(
            action=str(payload.get("action") or ""),
            pr=pr,
            commenter=Actor.from_payload(comment.get("user") or payload.get("sender")),
            body=str(comment.get("body") or ""),
            app_login=app_login,
            created_at=epoch(comment.get("created_at")),
        )


@dataclass(frozen=True)
class CheckRunAction:
    """`check_run` `requested_action` (a button) or `rerequested` (Re-run) on a check at `sha`."""

    action: str
    pr: PullRequest  # fetched: the check's PR as it is now
    sha: str  # the check run's head_sha
    actor: Actor
    identifier: str | None = None  # requested_action.identifier
    batch: str | None = None  # the batch the check reports, if it is one batch's check

    @classmethod
    def from_payload(
        cls, payload: Mapping[str, Any], pr: PullRequest, batch: str | None = None
    ) -> CheckRunAction:
        return cls(
            action=str(payload.get("action") or ""),
            pr=pr,
            sha=str((payload.get("check_run") or {}).get("head_sha") or ""),
            actor=Actor.from_payload(payload.get("sender")),
            identifier=(payload.get("requested_action") or {}).get("identifier"),
            batch=batch,
        )


class Effect(StrEnum):
    """What the handler does, in the order listed, before enqueueing `Decision.run`."""

    CANCEL_RUNS = "cancel_runs"  # cancel every queued or running run of the PR
    CANCEL_STALE_RUNS = "cancel_stale_runs"  # cancel the PR's runs at SHAs other than .sha
    VOID_APPROVALS = "void_approvals"  # delete every stored approval of the PR
    REMOVE_LABEL = "remove_label"  # remove the approval label from the PR
    STORE_APPROVAL = "store_approval"  # store Decision.approval
    # Check Run(s) at .sha: conclusion action_required, text = reasons, "Approve and run" button.
    RESET_CHECKS_TO_ACTION_REQUIRED = "reset_checks_to_action_required"
    REACT_EYES = "react_eyes"  # react 👀 to the comment
    POST_STATUS = "post_status"  # comment the state of the PR's runs
    REPLY = "reply"  # comment Decision.reply on the PR
    # The PR's runs cancelled; each auto batch's Check Run at .sha completed (cancelled) with
    # the reasons and no button: nothing runs for a PR whose head repository was deleted.
    SHOW_HEAD_GONE = "show_head_gone"


@dataclass(frozen=True)
class RunRequest:
    """Batches to run at one commit of one PR (a host re-checks approved ones with GitHub before
    it starts them: `workers.host.github_refusal`)."""

    repo: str
    number: int
    sha: str
    batches: tuple[str, ...]
    trigger: str  # pull_request.<action>, label, command, button, rerequested
    requested_by: str
    skip_done: bool = False  # leave out batches that already completed at this commit


@dataclass(frozen=True)
class Decision:
    """The outcome of one event. `reasons` are human sentences for logs and the check's text."""

    trust: Trust
    sha: str
    reasons: tuple[str, ...]
    effects: tuple[Effect, ...] = ()
    run: RunRequest | None = None
    approval: Approval | None = None
    reply: str | None = None

    def __post_init__(self) -> None:
        if (self.approval is not None) != (Effect.STORE_APPROVAL in self.effects):
            raise ValueError("STORE_APPROVAL and Decision.approval go together")
        if (self.reply is not None) != (Effect.REPLY in self.effects):
            raise ValueError("REPLY and Decision.reply go together")
        if self.run is not None and self.trust not in RUNNABLE:
            raise ValueError(f"a {self.trust} decision cannot run anything")

    @property
    def summary(self) -> str:
        return " ".join(self.reasons)


def classify_pr(pr: PullRequest, author_role: Role, approval: Approval | None = None) -> Trust:
    """TRUSTED: same-repo PR whose author has write, maintain or admin. Otherwise APPROVED when
    `approval` is for exactly the PR's head SHA, else NEEDS_APPROVAL."""
    if pr.same_repo and author_role.can_write:
        return Trust.TRUSTED
    if approval is not None and approval.covers(pr):
        return Trust.APPROVED
    return Trust.NEEDS_APPROVAL


# --- pull_request ----------------------------------------------------------------------------


def decide_pull_request(
    event: PullRequestEvent,
    author_role: Role,
    approval: Approval | None,
    config_label: str,
    auto_batches: Sequence[str],
    *,
    sender_role: Role = Role.NONE,
) -> Decision:
    """The rule for each `pull_request` action (others are IGNORED):

    - opened, reopened, ready_for_review: a trusted or approved PR runs the auto batches; an
      untrusted one gets an action_required check with the "Approve and run" button. Drafts
      run nothing automatically.
    - synchronize: the new commit voids every approval (label removed, check reset to
      action_required) and cancels runs of older commits; a trusted PR runs the auto batches.
    - labeled with `config_label`: by a sender with write+, approves the event's head SHA and
      runs the auto batches (drafts: approves only; a head approved another way: runs those
      not yet completed); by anyone else, nothing runs and the label is removed with an
      explanation.
    - unlabeled `config_label` by a writer (not a bot): revokes the approval, cancels runs.
    - closed: cancels the PR's runs.
    """
    pr = event.pr
    if event.action == "closed":
        return Decision(
            Trust.IGNORED,
            pr.head_sha,
            ("PR closed: its runs are cancelled.",),
            effects=(Effect.CANCEL_RUNS,),
        )
    if not pr.is_open:
        return _ignored(pr, f"PR is {pr.state}.")
    if pr.head_gone:
        return head_gone(pr)
    trigger = f"pull_request.{event.action}"
    if event.action in ("opened", "reopened", "ready_for_review"):
        trust = classify_pr(pr, author_role, approval)
        return _automatic(pr, trust, author_role, auto_batches, trigger)
    if event.action == "synchronize":
        return _on_push(pr, author_role, approval, config_label, auto_batches)
    if event.action in ("labeled", "unlabeled") and event.label == config_label:
        decide = _on_label if event.action == "labeled" else _on_unlabel
        return decide(event, author_role, sender_role, approval, config_label, auto_batches)
    return _ignored(pr, f"{trigger} needs nothing from gpuci.")


def _automatic(
    pr: PullRequest,
    trust: Trust,
    author_role: Role,
    auto_batches: Sequence[str],
    trigger: str,
    effects: tuple[Effect, ...] = (),
    reasons: tuple[str, ...] = (),
    who: str | None = None,
) -> Decision:
    """What an automatic trigger (caused by `who`, default the PR's author) does with a PR
    whose trust is known."""
    if pr.draft:
        why = "Draft PR: no automatic runs (mark it ready for review, or `/gpuci run ...`)."
        return Decision(trust, pr.head_sha, (*reasons, why), effects)
    if not auto_batches:
        why = "No batches run automatically on PRs (no layer with trigger: pull_request)."
        return Decision(trust, pr.head_sha, (*reasons, why), effects)
    if trust in RUNNABLE:
        why = f"{_trust_reason(pr, trust, author_role)} Running {_names(auto_batches)}."
        run = _run(pr, auto_batches, trigger, who or pr.author)
        return Decision(trust, pr.head_sha, (*reasons, why), effects, run=run)
    why = _approval_needed(pr, author_role)
    effects = (*effects, Effect.RESET_CHECKS_TO_ACTION_REQUIRED)
    return Decision(trust, pr.head_sha, (*reasons, why), effects)


def _on_push(
    pr: PullRequest,
    author_role: Role,
    approval: Approval | None,
    config_label: str,
    auto_batches: Sequence[str],
) -> Decision:
    effects = [Effect.CANCEL_STALE_RUNS, Effect.VOID_APPROVALS]
    if config_label in pr.labels:
        effects.append(Effect.REMOVE_LABEL)
    reasons: tuple[str, ...] = ()
    if approval is not None and approval.sha != pr.head_sha:
        reasons = (
            f"New commit {_short(pr.head_sha)}: the approval of {_short(approval.sha)} "
            "no longer applies.",
        )
    trust = classify_pr(pr, author_role, None)  # a push voids every approval
    return _automatic(
        pr, trust, author_role, auto_batches, "pull_request.synchronize", tuple(effects), reasons
    )


def _on_label(
    event: PullRequestEvent,
    author_role: Role,
    sender_role: Role,
    approval: Approval | None,
    config_label: str,
    auto_batches: Sequence[str],
) -> Decision:
    pr, sender = event.pr, event.sender.login
    if event.sender.is_bot() or not sender_role.can_write:
        text = (
            f"@{sender}: the `{config_label}` label approves GPU runs only when added by a "
            f"user with write access (yours: `{sender_role}`), so it was removed."
        )
        return Decision(
            Trust.DENIED, pr.head_sha, (text,), (Effect.REMOVE_LABEL, Effect.REPLY), reply=text
        )
    trust = classify_pr(pr, author_role, approval)
    if trust is Trust.TRUSTED:
        return Decision(
            trust,
            pr.head_sha,
            (_trust_reason(pr, trust, author_role) + " The label changes nothing.",),
        )
    if trust is Trust.APPROVED:  # approved another way: its automatic batches run, once
        return _not_again(_automatic(pr, trust, author_role, auto_batches, "label", who=sender))
    new = _approval(pr, sender, ApprovalVia.LABEL)
    reasons = (f"@{sender} approved {_short(pr.head_sha)} with the `{config_label}` label.",)
    decided = _automatic(
        pr, Trust.APPROVED, author_role, auto_batches, "label", (), reasons, who=sender
    )
    return _with_approval(decided, new)


def _on_unlabel(
    event: PullRequestEvent,
    author_role: Role,
    sender_role: Role,
    approval: Approval | None,
    config_label: str,
    auto_batches: Sequence[str],
) -> Decision:
    pr = event.pr
    if event.sender.is_bot() or not sender_role.can_write:
        return _ignored(pr, "The approval label was removed by a bot or a non-writer.")
    if classify_pr(pr, author_role, None) is Trust.TRUSTED:
        return _ignored(pr, "The PR is trusted; the label changes nothing.")
    why = f"@{event.sender.login} removed the `{config_label}` label: approval revoked."
    effects = (Effect.CANCEL_RUNS, Effect.VOID_APPROVALS)
    return _automatic(
        pr, Trust.NEEDS_APPROVAL, author_role, auto_batches, "unlabeled", effects, (why,)
    )


# --- comments --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Asked:
    """What the commands of one comment ask for, merged."""

    approve: bool = False
    approve_sha: str | None = None
    runs: tuple[str, ...] = ()  # explicitly requested batches
    explicit_run: bool = False
    effects: tuple[Effect, ...] = ()
    replies: tuple[str, ...] = ()


def decide_command(
    event: CommentEvent,
    *,
    author_role: Role,
    commenter_role: Role,
    approval: Approval | None,
    valid_batches: Sequence[str],
    layers: Mapping[str, Sequence[str]],
    auto_batches: Sequence[str],
    failed_batches: Sequence[str] = (),
    runs_allowed: bool = True,
    head_since: float | None = None,
    known_heads: Sequence[str] = (),
) -> Decision:
    """The rule for `/gpuci` commands in an `issue_comment` on a PR:

    - Only `created` comments on open PRs are read; bots (the app's own login included) are
      IGNORED, as are comments without a command.
    - The commenter needs write+ (their role, never `author_association`); anyone else gets
      DENIED with a reply.
    - `approve` and every run command from a writer on an untrusted PR approve the head SHA
      only if it has been the head without a break since before the comment was written
      (`head_since`: since when, as far as gpuci knows). `approve SHA` names the commit:
      the full SHA of the head approves it whenever it became the head; a prefix (7+ hex)
      must be the head's, match no other of the PR's `known_heads`, and pass the time rule.
    - An approval runs the auto batches (with what run commands name, except on drafts);
      `approve` alone on an approved head runs nothing; `rerun failed` runs
      `failed_batches`. No runs when `runs_allowed` is False (the per-PR rate limit).
    - cancel, status and help are effects and a reply; invalid lines are answered with why.
    """
    pr, who = event.pr, event.commenter.login
    unread = _unread_comment(event)
    if unread is not None:
        return unread
    parsed = parse_comment(event.body, valid_batches, layers)
    if not parsed:
        return _ignored(pr, "No /gpuci command in the comment.")
    if not commenter_role.can_write:
        text = command_refusal(pr.repo, who, commenter_role)
        denied = (Effect.REACT_EYES, Effect.REPLY)
        return Decision(Trust.DENIED, pr.head_sha, (text,), denied, reply=text)
    if pr.head_gone:
        return head_gone(pr, reply=True)
    asked = _merge(parsed, valid_batches, layers, failed_batches, pr)
    trust = classify_pr(pr, author_role, approval)
    reasons, replies = [_trust_reason(pr, trust, author_role)], list(asked.replies)
    new_approval = None
    if asked.approve or asked.explicit_run:
        refusal = _command_approval_refusal(
            pr, trust, asked, event.created_at, head_since, known_heads
        )
        if refusal is not None:
            replies.append(refusal)
        elif trust is Trust.NEEDS_APPROVAL:
            new_approval, trust = _approval(pr, who, ApprovalVia.COMMAND), Trust.APPROVED
            reasons.append(f"@{who} approved {_short(pr.head_sha)} with a command.")
    run = None
    if trust in RUNNABLE:
        batches, held = _command_batches(asked, pr, new_approval, auto_batches, runs_allowed)
        run = _run(pr, batches, "command", who) if batches else None
        reasons += [f"Running {_names(batches)} at {_short(pr.head_sha)}."] if batches else []
        if held:
            replies.append(
                f"Too many command-triggered runs on this PR lately: {_names(held)} not run. "
                "Try again later."
            )
    effects = (Effect.REACT_EYES, *asked.effects)
    effects += (Effect.STORE_APPROVAL,) if new_approval is not None else ()
    reply = "\n\n".join(replies) or None
    effects += (Effect.REPLY,) if reply is not None else ()
    return Decision(trust, pr.head_sha, tuple(reasons), effects, run, new_approval, reply)


def _command_batches(
    asked: _Asked,
    pr: PullRequest,
    new_approval: Approval | None,
    auto_batches: Sequence[str],
    runs_allowed: bool,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(batches to run, batches held back by the rate limit). A new approval runs the auto
    batches, as the label and the button do, whatever the rate limit (not on drafts when
    the comment names what to run)."""
    named = asked.runs if asked.explicit_run else ()
    approved = () if new_approval is None or (asked.explicit_run and pr.draft) else auto_batches
    if not runs_allowed:
        return tuple(approved), tuple(b for b in named if b not in approved)
    return tuple(natural_sorted({*named, *approved})), ()


def command_refusal(repo: str, who: str, role: Role) -> str:
    """The reply to a `/gpuci` command from a user without write access."""
    return f"@{who}: `/gpuci` commands need write access to {repo} (yours: `{role}`)."


def refuse_command(repo: str, who: str, role: Role, *, reply: bool) -> Decision:
    """A command from a user without write access, decided from the webhook alone (the role
    is the permission API's): DENIED, answered once (`reply`: the first such command of this
    user on this PR in a while), later ones only logged. No head is known, so `sha` is ""."""
    text = command_refusal(repo, who, role)
    if not reply:
        return Decision(Trust.DENIED, "", (text, "Already answered lately: not replied again."))
    return Decision(Trust.DENIED, "", (text,), (Effect.REPLY,), reply=text)


def _unread_comment(event: CommentEvent) -> Decision | None:
    """IGNORED for comments gpuci never reads: edits, deletions, bots, closed PRs."""
    if event.action != "created":
        return _ignored(event.pr, f"Comment {event.action}: only new comments are read.")
    if event.commenter.is_bot(event.app_login):
        return _ignored(event.pr, f"Comment by bot {event.commenter.login}.")
    if not event.pr.is_open:
        return _ignored(event.pr, f"Comment on a {event.pr.state} PR.")
    return None


def _merge(
    parsed: Sequence[Command | CommandError],
    valid_batches: Sequence[str],
    layers: Mapping[str, Sequence[str]],
    failed_batches: Sequence[str],
    pr: PullRequest,
) -> _Asked:
    """Fold a comment's commands into one request; cancel comes before any new run."""
    approve, approve_sha, explicit = False, None, False
    runs: set[str] = set()
    effects: list[Effect] = []
    replies: list[str] = []
    for item in parsed:
        if isinstance(item, CommandError):
            line = item.line[:80].replace("`", "'")
            replies.append(f"`{line}`: {item.message}")
        elif item.kind is CommandKind.APPROVE:
            approve, approve_sha = True, item.sha or approve_sha
        elif item.kind is CommandKind.RERUN_FAILED:
            explicit = True
            runs.update(failed_batches)
            if not failed_batches:
                replies.append(f"No failed batches at {_short(pr.head_sha)} to rerun.")
        elif item.runs:
            explicit = True
            runs.update(item.batches)
        elif item.kind is CommandKind.HELP:
            replies.append(help_text(valid_batches, layers))
        else:
            effects.append(_COMMAND_EFFECTS[item.kind])
    ordered = tuple(e for e in _EFFECT_ORDER if e in effects)
    return _Asked(
        approve, approve_sha, tuple(natural_sorted(runs)), explicit, ordered, tuple(replies)
    )


_COMMAND_EFFECTS = {CommandKind.CANCEL: Effect.CANCEL_RUNS, CommandKind.STATUS: Effect.POST_STATUS}
_EFFECT_ORDER = tuple(Effect)


def _command_approval_refusal(
    pr: PullRequest,
    trust: Trust,
    asked: _Asked,
    created_at: float | None,
    head_since: float | None,
    known_heads: Sequence[str],
) -> str | None:
    """Why a writer's comment approves nothing, or None: it must be about the head it saw."""
    head, named = _short(pr.head_sha), asked.approve_sha
    if named is not None:
        problem = _named_commit_problem(pr.head_sha, named, known_heads)
        if problem is not None:
            return problem
    if trust is not Trust.NEEDS_APPROVAL:
        if asked.approve and not asked.explicit_run:
            return f"Nothing to approve: commit {head} is already {trust}."
        return None
    if named is not None and len(named) == len(pr.head_sha):
        return None  # the commit itself is named: whenever it became the head, it is this one
    if created_at is not None and head_since is not None and head_since > created_at:
        return (
            f"Not approved: {head} has been the head only since {iso(head_since)}, after your "
            f"comment ({iso(created_at)}), so it may not be the commit you reviewed. Review it, "
            f"then comment `/gpuci approve {pr.head_sha}`."
        )
    return None


def _named_commit_problem(head_sha: str, named: str, known_heads: Sequence[str]) -> str | None:
    """Why `approve SHA` does not name the head unambiguously, or None."""
    if not head_sha.startswith(named):
        return (
            f"Not approved: `{named[:12]}` is not the head commit; the head is "
            f"{_short(head_sha)}. Review it, then comment `/gpuci approve {head_sha}`."
        )
    if any(sha != head_sha and sha.startswith(named) for sha in known_heads):
        return (
            f"Not approved: `{named}` is the prefix of more than one commit this PR has had at "
            f"its head. Comment `/gpuci approve {head_sha}` (the full SHA)."
        )
    return None


# --- check run buttons -----------------------------------------------------------------------


def decide_button(
    event: CheckRunAction,
    *,
    author_role: Role,
    actor_role: Role,
    approval: Approval | None,
    auto_batches: Sequence[str],
) -> Decision:
    """The rule for `check_run` events a user causes:

    - requested_action `approve` ("Approve and run") by a writer on a check at the PR's head:
      approves that SHA and runs the auto batches (even on a draft: it is explicit); on a
      head approved another way, runs those of them not yet completed. A non-writer is
      DENIED with a reply; a check of an older commit approves nothing.
    - rerequested (Re-run) by a writer at the head: runs the check's batch (or the auto
      batches) if the PR is trusted or approved; it never approves.
    Closed PRs, bots and other actions are IGNORED.
    """
    pr, who = event.pr, event.actor.login
    if not pr.is_open or event.actor.is_bot():
        return _ignored(pr, "Check action on a closed PR or by a bot.")
    if pr.head_gone:
        return head_gone(pr)
    if event.action == "requested_action" and event.identifier == APPROVE_ACTION_ID:
        if not actor_role.can_write:
            text = f"@{who}: approving GPU runs needs write access (yours: `{actor_role}`)."
            return Decision(Trust.DENIED, pr.head_sha, (text,), (Effect.REPLY,), reply=text)
        if event.sha != pr.head_sha:
            return _ignored(pr, f"Button of an older commit {_short(event.sha)}: not the head.")
        trust = classify_pr(pr, author_role, approval)
        run = _run(pr, auto_batches, "button", who) if auto_batches else None
        if trust is Trust.APPROVED:  # approved another way: its automatic batches run, once
            why = f"{_short(pr.head_sha)} is already approved: running {_names(auto_batches)}."
            return _not_again(Decision(trust, pr.head_sha, (why,), run=run))
        reasons = (f"@{who} approved {_short(pr.head_sha)} with the button.",)
        if trust is Trust.TRUSTED:
            return Decision(trust, pr.head_sha, reasons, run=run)
        new = _approval(pr, who, ApprovalVia.BUTTON)
        return Decision(Trust.APPROVED, pr.head_sha, reasons, (Effect.STORE_APPROVAL,), run, new)
    if event.action == "rerequested":
        return _rerequested(event, author_role, actor_role, approval, auto_batches)
    return _ignored(pr, f"check_run.{event.action} needs nothing from gpuci.")


def _rerequested(
    event: CheckRunAction,
    author_role: Role,
    actor_role: Role,
    approval: Approval | None,
    auto_batches: Sequence[str],
) -> Decision:
    pr, who = event.pr, event.actor.login
    if not actor_role.can_write:
        return Decision(Trust.DENIED, pr.head_sha, (f"@{who} may not re-run (`{actor_role}`).",))
    if event.sha != pr.head_sha:
        return _ignored(pr, f"Re-run of an older commit {_short(event.sha)}: not the head.")
    trust = classify_pr(pr, author_role, approval)
    if trust not in RUNNABLE:
        return Decision(
            trust,
            pr.head_sha,
            (_approval_needed(pr, author_role),),
            (Effect.RESET_CHECKS_TO_ACTION_REQUIRED,),
        )
    batches = (event.batch,) if event.batch else tuple(auto_batches)
    run = _run(pr, batches, "rerequested", who) if batches else None
    return Decision(trust, pr.head_sha, (f"@{who} re-ran {_names(batches)}.",), run=run)


# --- a deleted head repository --------------------------------------------------------------


def head_gone(pr: PullRequest, *, reply: bool = False) -> Decision:
    """Nothing runs for a PR whose head repository was deleted, whoever asks: its runs are
    cancelled, its approvals voided, and its checks say why (a command gets the reason as a
    reply). GitHub keeps the commits, but no one can push to the PR again, so approving or
    running it would vouch for an abandoned branch that can never get a fix."""
    text = (
        "Not run: the head repository of this PR was deleted, so no one can push to it any "
        f"more and gpuci runs nothing for it (commit {_short(pr.head_sha)}). To test these "
        f"changes, push them to a branch (`git fetch origin pull/{pr.number}/head`) and open "
        "a new PR."
    )
    effects: tuple[Effect, ...] = (Effect.VOID_APPROVALS, Effect.SHOW_HEAD_GONE)
    if not reply:
        return Decision(Trust.HEAD_GONE, pr.head_sha, (text,), effects)
    effects = (Effect.REACT_EYES, *effects, Effect.REPLY)
    return Decision(Trust.HEAD_GONE, pr.head_sha, (text,), effects, reply=text)


# --- helpers ---------------------------------------------------------------------------------


def _ignored(pr: PullRequest, why: str) -> Decision:
    return Decision(Trust.IGNORED, pr.head_sha, (why,))


def _run(pr: PullRequest, batches: Sequence[str], trigger: str, who: str) -> RunRequest:
    return RunRequest(pr.repo, pr.number, pr.head_sha, tuple(batches), trigger, who)


def _approval(pr: PullRequest, approver: str, via: ApprovalVia) -> Approval:
    return Approval(pr.repo, pr.number, pr.head_sha, approver, via)


def _not_again(decision: Decision) -> Decision:
    """The decision's run without the batches that already completed at its commit."""
    run = replace(decision.run, skip_done=True) if decision.run else None
    return replace(decision, run=run)


def _with_approval(decision: Decision, approval: Approval) -> Decision:
    effects = (Effect.STORE_APPROVAL, *decision.effects)
    return Decision(
        decision.trust,
        decision.sha,
        decision.reasons,
        effects,
        decision.run,
        approval,
        decision.reply,
    )


def _trust_reason(pr: PullRequest, trust: Trust, author_role: Role) -> str:
    if trust is Trust.TRUSTED:
        return f"Same-repository PR by @{pr.author} (`{author_role}`): trusted."
    if trust is Trust.APPROVED:
        return f"Commit {_short(pr.head_sha)} is approved."
    return _approval_needed(pr, author_role)


def _approval_needed(pr: PullRequest, author_role: Role) -> str:
    if pr.same_repo:
        why = f"@{pr.author} has `{author_role}` access, not write"
    else:
        why = f"the PR comes from the fork `{pr.head_repo or '(deleted)'}`"
    return (
        f"GPU runs need approval: {why}. A user with write access can approve commit "
        f'{_short(pr.head_sha)} with the "{APPROVE_ACTION_LABEL}" button, the approval '
        "label or `/gpuci approve`."
    )


def _short(sha: str) -> str:
    return f"`{sha[:12]}`"


def _names(batches: Sequence[str]) -> str:
    return ", ".join(f"`{b}`" for b in batches)
