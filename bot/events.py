"""The events worker's job: one webhook delivery -> trust decision -> Check Runs, replies, runs."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from bot import outsiders, runs
from bot.commands import command_runs_allowed, natural_sorted, parse_comment
from bot.github_app import GitHubApp, RepoClient
from bot.runs import Run, RunState, RunTrigger
from bot.timestamps import epoch
from bot.trust import (
    APPROVE_ACTION_DESCRIPTION,
    APPROVE_ACTION_ID,
    APPROVE_ACTION_LABEL,
    Actor,
    CheckRunAction,
    CommentEvent,
    Decision,
    Effect,
    PullRequest,
    PullRequestEvent,
    Role,
    RunRequest,
    decide_button,
    decide_command,
    decide_pull_request,
    refuse_command,
)
from contract import keys
from contract.config import DEFAULT_APPROVAL_LABEL, Config, ConfigError, ConfigIssue, load_config
from contract.roles import role_from_api
from contract.settings import Settings

log = logging.getLogger("gpuci.events")

CONFIG_FILE = ".gpuci.yml"
CONFIG_CHECK = "gpuci / config"
BATCH_CHECK_PREFIX = "gpuci / batch "
STEP_TTL_S = 7 * 24 * 3600
PR_ACTIONS = frozenset(
    {"opened", "reopened", "synchronize", "ready_for_review", "closed", "labeled", "unlabeled"}
)
NEW_HEAD_ACTIONS = frozenset({"opened", "reopened", "synchronize"})
FAILED = frozenset({"failure", "timed_out"})


def batch_check_name(batch: str) -> str:
    return f"{BATCH_CHECK_PREFIX}{batch}"


def batch_of_check(name: str) -> str | None:
    return name.removeprefix(BATCH_CHECK_PREFIX) if name.startswith(BATCH_CHECK_PREFIX) else None


# --- the process's clients -------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What every job of this process shares: settings, Redis and the GitHub App."""

    settings: Settings
    redis: Redis
    github: GitHubApp


@functools.lru_cache(maxsize=1)
def _context_for(settings: Settings) -> Context:
    redis = Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    github = GitHubApp.from_settings(settings)
    github.meter = functools.partial(count_github_call, redis)
    return Context(settings, redis, github)


def count_github_call(conn: Redis, method: str, status: str, remaining: int) -> None:
    """Count a REST call for /metrics; counting never fails the job."""
    try:
        pipe = conn.pipeline()
        pipe.hincrby(keys.github_calls(), f"{method}:{status}", 1)
        if remaining >= 0:
            pipe.hset(keys.github_calls(), "remaining", remaining)
        pipe.execute()
    except RedisError as exc:
        log.warning("could not count a GitHub call: %s", exc)


def context() -> Context:
    """Built on the first job (never at import) and kept while the settings stay the same."""
    return _context_for(Settings.from_env())


# --- the job ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    event: str
    delivery_id: str
    payload: Mapping[str, Any]

    @property
    def installation_id(self) -> int:
        return int(self.payload["installation"]["id"])


_REPO_AND_APP = (("repository.full_name", str), ("installation.id", int))
REQUIRED: dict[str, tuple[tuple[str, type], ...]] = {
    "pull_request": (
        ("action", str),
        ("pull_request.number", int),
        ("pull_request.head.sha", str),
        ("pull_request.base.repo.full_name", str),
        *_REPO_AND_APP,
    ),
    "issue_comment": (
        ("action", str),
        ("issue.number", int),
        ("comment.id", int),
        ("comment.body", str),
        *_REPO_AND_APP,
    ),
    "check_run": (
        ("action", str),
        ("check_run.head_sha", str),
        ("check_run.name", str),
        *_REPO_AND_APP,
    ),
    "check_suite": (("action", str), ("check_suite.head_sha", str), *_REPO_AND_APP),
    "installation": (("action", str), ("installation.id", int)),
    "installation_repositories": (("action", str), ("installation.id", int)),
}


def shape_problem(event: str, payload: Any) -> str | None:
    """Why a payload cannot be handled (unknown event, missing or mistyped field), or None."""
    if event not in REQUIRED:
        return f"event {event!r} is not handled"
    if not isinstance(payload, Mapping):
        return "payload is not a JSON object"
    for path, kind in REQUIRED[event]:
        value: Any = payload
        for part in path.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{path} is missing or not a {kind.__name__}"
    return None


def handle_delivery(event: str, delivery_id: str, payload: dict[str, Any]) -> str:
    """The RQ job for one webhook delivery; returns what happened, in a few words. Payloads
    gpuci cannot read are logged and dropped (a retry would not help); GitHub and Redis errors
    raise, so the job is recorded as failed with its traceback."""
    problem = shape_problem(event, payload)
    if problem is not None:
        log.warning("delivery=%s event=%s dropped: %s", delivery_id, event, problem)
        return f"dropped: {problem}"
    found = Delivery(event, delivery_id, payload)
    ctx = context()
    _remember_repos(ctx, found)
    return HANDLERS[event](ctx, found)


def _remember_repos(ctx: Context, d: Delivery) -> None:
    """Record which installation serves each repository gpuci hears from (for schedules)."""
    names = [str((d.payload.get("repository") or {}).get("full_name") or "")]
    for key in ("repositories", "repositories_added"):
        names += [str(r.get("full_name")) for r in d.payload.get(key) or () if isinstance(r, dict)]
    found: dict[Any, Any] = {n: str(d.installation_id) for n in names if "/" in n}
    if d.event == "installation" and d.payload.get("action") == "deleted":
        if found:
            ctx.redis.hdel(keys.repos(), *found)
        return
    if found:
        ctx.redis.hset(keys.repos(), mapping=found)
    for r in d.payload.get("repositories_removed") or ():
        if isinstance(r, dict) and r.get("full_name"):
            ctx.redis.hdel(keys.repos(), str(r["full_name"]))


# --- one delivery about one PR ---------------------------------------------------------------


@dataclass
class Handling:
    """A delivery being handled for one PR: where its effects go, and its log lines."""

    ctx: Context
    delivery: Delivery
    gh: RepoClient
    pr: PullRequest
    cause: str  # "pull_request.closed by @alice": why runs get cancelled
    config: Config | None = None
    config_text: str = ""
    comment_id: int | None = None
    _roles: dict[str, Role] = field(default_factory=dict)

    @property
    def conn(self) -> Redis:
        return self.ctx.redis

    @property
    def auto_batches(self) -> tuple[str, ...]:
        return self.config.auto_batches() if self.config else ()

    def log(self, level: int, message: str, *args: Any) -> None:
        sha = self.pr.head_sha[:10]
        where = f"delivery={self.delivery.delivery_id} repo={self.pr.repo} pr={self.pr.number}"
        log.log(level, f"{where} sha={sha}: {message}", *args)

    def role(self, login: str) -> Role:
        """The user's role on the base repository (collaborator permission API), once each."""
        if login not in self._roles:
            self._roles[login] = role_from_api(*self.gh.role_of(login)) if login else Role.NONE
        return self._roles[login]

    def once(self, step: str, action: Callable[[], object]) -> None:
        """Do a non-repeatable effect (a comment) at most once per delivery."""
        if not _once(self.conn, self.delivery.delivery_id, step, action):
            self.log(logging.INFO, "%s already done for this delivery", step)


def _once(conn: Redis, delivery_id: str, step: str, action: Callable[[], object]) -> bool:
    """Do `action` unless this delivery did `step` already; whether it ran."""
    key = keys.delivery_steps(delivery_id)
    if conn.sismember(key, step):
        return False
    action()
    conn.sadd(key, step)
    conn.expire(key, STEP_TTL_S)
    return True


def _handling(ctx: Context, d: Delivery, pr: PullRequest, cause: str) -> Handling:
    gh = ctx.github.repo(d.installation_id, pr.repo)
    return Handling(ctx, d, gh, pr, cause)


def _fetch_pr(ctx: Context, d: Delivery, number: int) -> PullRequest:
    gh = ctx.github.repo(d.installation_id, d.payload["repository"]["full_name"])
    return PullRequest.from_payload(gh.pull(number))


# --- .gpuci.yml ------------------------------------------------------------------------------


def load_repo_config(h: Handling, *, check_head: bool) -> bool:
    """Read .gpuci.yml from the default branch (never the PR head) into `h`; False when the
    repository has none or it is invalid (then a failing `gpuci / config` check says why).
    With `check_head`, a PR that changes the file gets its version validated (not used)."""
    branch = str(h.delivery.payload["repository"].get("default_branch") or "main")
    text = h.gh.file_text(CONFIG_FILE, branch)
    if text is None:
        h.log(logging.INFO, "no %s on %s: nothing to do", CONFIG_FILE, branch)
        return False
    head = h.gh.file_text(CONFIG_FILE, h.pr.head_sha) if check_head else None
    head_issues = _issues(head) if head is not None and head != text else None
    base_issues = _issues(text)
    if base_issues or head_issues is not None:
        report_config(h, branch, base_issues, head_issues)
    if base_issues:
        h.log(
            logging.WARNING,
            "%s on %s is invalid: %d issue(s)",
            CONFIG_FILE,
            branch,
            len(base_issues),
        )
        return False
    h.config, h.config_text = load_config(text, CONFIG_FILE), text
    return True


def _issues(text: str) -> list[ConfigIssue]:
    try:
        load_config(text, CONFIG_FILE)
    except ConfigError as exc:
        return exc.issues
    return []


def report_config(
    h: Handling, branch: str, base: list[ConfigIssue], head: list[ConfigIssue] | None
) -> None:
    """The `gpuci / config` check on the head commit: the default branch's errors, and the
    PR's own version of the file when it changes it."""
    parts = []
    if base:
        title = f"{CONFIG_FILE} on {branch} is invalid: no GPU runs"
        parts.append(f"`{CONFIG_FILE}` on `{branch}` (what gpuci uses):\n\n{_issue_list(base)}")
    if head:
        title = title if base else f"This PR's {CONFIG_FILE} has {len(head)} error(s)"
        parts.append(f"This PR's `{CONFIG_FILE}` (validated, not used):\n\n{_issue_list(head)}")
    elif head is not None:
        title = title if base else "config change is valid"
        parts.append(
            f"This PR changes `{CONFIG_FILE}`: the new version is valid. It takes effect once "
            f"merged into `{branch}`; runs use the `{branch}` version."
        )
    conclusion = "failure" if base or head else "success"
    output = {"title": title, "summary": "\n\n".join(parts)}
    body = {"status": "completed", "conclusion": conclusion, "output": output}
    check_id, created = ensure_check(h, h.pr.head_sha, CONFIG_CHECK, "config", body)
    if not created:
        h.gh.update_check_run(check_id, body)


def _issue_list(issues: list[ConfigIssue]) -> str:
    return "\n".join(f"- `{issue}`" for issue in issues)


# --- check runs ------------------------------------------------------------------------------


def ensure_check(
    h: Handling, sha: str, name: str, purpose: str, body: dict[str, Any]
) -> tuple[int, bool]:
    """The check run gpuci made for `purpose` at `sha`, creating it once: (id, created now).
    An "attempt" record left by a worker that died mid-create is resolved by looking the run
    up by its external_id before creating another."""
    conn, repo = h.conn, h.pr.repo
    body = {"name": name, "head_sha": sha, "external_id": purpose, **body}
    found = runs.recorded_check(conn, repo, sha, name, purpose)
    if isinstance(found, int):
        return found, False
    if found == runs.ATTEMPT:
        existing = h.gh.find_check_run(sha, name, str(body["external_id"]))
        if existing is not None:
            runs.record_check(conn, repo, sha, name, purpose, existing)
            return existing, False
    runs.record_check(conn, repo, sha, name, purpose, runs.ATTEMPT)
    check_id = h.gh.create_check_run(body)
    runs.record_check(conn, repo, sha, name, purpose, check_id)
    return check_id, True


def _details_url(h: Handling, run: Run) -> str:
    return f"{h.ctx.settings.public_url.rstrip('/')}/runs/{run.run_id}"


def _queued_check(h: Handling, run: Run) -> dict[str, Any]:
    batch = h.config.batches.get(run.batch) if h.config else None
    gpus = f"{batch.gpus} GPU{'s' if batch.gpus != 1 else ''}" if batch else "its GPUs"
    summary = (
        f"Batch `{run.batch}` at `{run.sha[:12]}` waits for a GPU host with {gpus} idle. "
        f"Requested by @{run.requested_by} ({run.trigger}); run {run.run_id}."
    )
    if run.approval_text:
        summary += f"\n\n{run.approval_text}."
    return {
        "external_id": run.run_id,
        "status": "queued",
        "details_url": _details_url(h, run),
        "output": {"title": "Waiting for a GPU host", "summary": summary},
    }


def _approval_check(h: Handling, run: Run, reasons: str) -> dict[str, Any]:
    return {
        "external_id": run.run_id,
        "status": "completed",
        "conclusion": "action_required",
        "details_url": _details_url(h, run),
        "output": {"title": "Approval needed before GPU runs", "summary": reasons},
        "actions": [
            {
                "label": APPROVE_ACTION_LABEL,
                "description": APPROVE_ACTION_DESCRIPTION,
                "identifier": APPROVE_ACTION_ID,
            }
        ],
    }


def _cancelled_check(run: Run) -> dict[str, Any]:
    output = {"title": "Cancelled", "summary": run.wait_reason}
    return {"status": "completed", "conclusion": "cancelled", "output": output, "actions": []}


def _show_run(h: Handling, run: Run, purpose: str, body: dict[str, Any]) -> Run:
    """Give a run its check run for `purpose` (once) and remember it on the run."""
    name = batch_check_name(run.batch)
    check_id, _ = ensure_check(h, run.sha, name, f"{run.run_id}:{purpose}", body)
    if run.check_run_id != check_id:
        run = runs.update_run(h.conn, run, check_run_id=check_id)
    return run


# --- executing a Decision --------------------------------------------------------------------


def execute(h: Handling, decision: Decision) -> str:
    """The Decision's effects in order, then its runs."""
    h.log(logging.INFO, "%s: %s", decision.trust, decision.summary)
    for effect in decision.effects:
        EFFECTS[effect](h, decision)
    if decision.run is not None:
        start_runs(h, decision.run, str(decision.trust))
    return str(decision.trust)


def _cancel(
    h: Handling,
    reason: str,
    keep_sha: str | None = None,
    check: Callable[[Run], dict[str, Any]] = lambda run: _cancelled_check(run),
) -> list[Run]:
    pr = h.pr
    cancelled = runs.cancel_runs(h.conn, pr.repo, pr.number, reason, keep_sha=keep_sha)
    for run in cancelled:
        h.log(logging.INFO, "cancelled run %s (batch %s at %s)", run.run_id, run.batch, run.sha)
        if run.check_run_id:  # the final update: a report of the stopped run sends no other
            h.gh.update_check_run(run.check_run_id, check(run))
            runs.record_final_updates(h.conn, run.run_id, 1)
    return cancelled


def _cancel_runs(h: Handling, decision: Decision) -> None:
    _cancel(h, f"Cancelled: {h.cause}.")


def _cancel_stale_runs(h: Handling, decision: Decision) -> None:
    _cancel(h, f"Superseded by commit `{decision.sha[:12]}`.", keep_sha=decision.sha)


def _void_approvals(h: Handling, decision: Decision) -> None:
    if runs.void_approvals(h.conn, h.pr.repo, h.pr.number):
        h.log(logging.INFO, "approval voided")


def _remove_label(h: Handling, decision: Decision) -> None:
    label = h.config.approval_label if h.config else DEFAULT_APPROVAL_LABEL
    if not h.gh.remove_label(h.pr.number, label):
        h.log(logging.INFO, "label %s was already gone", label)


def _store_approval(h: Handling, decision: Decision) -> None:
    assert decision.approval is not None  # Decision guarantees it with STORE_APPROVAL
    runs.store_approval(h.conn, decision.approval)


def _reset_checks(h: Handling, decision: Decision) -> None:
    """Each auto batch at the decision's commit: a run awaiting approval whose check is
    action_required with the "Approve and run" button."""
    for batch in h.auto_batches:
        run = _active_run(h, decision.sha, batch)
        if run is None:
            run = runs.create_run(
                h.conn,
                **_run_fields(h, decision.sha, batch),
                trigger=RunTrigger.PULL_REQUEST,
                requested_by=h.pr.author,
                state=RunState.AWAITING_APPROVAL,
                wait_reason="approval needed",
            )
        elif run.state is not RunState.AWAITING_APPROVAL:
            continue
        _show_run(h, run, "approval", _approval_check(h, run, decision.summary))


def _react_eyes(h: Handling, decision: Decision) -> None:
    comment_id = h.comment_id
    if comment_id is not None:
        h.once("eyes", lambda: h.gh.react(comment_id, "eyes"))


def _post_status(h: Handling, decision: Decision) -> None:
    text = status_text(runs.runs_of_pr(h.conn, h.pr.repo, h.pr.number), h.pr.head_sha)
    h.once("status", lambda: h.gh.comment(h.pr.number, text))


def _reply(h: Handling, decision: Decision) -> None:
    reply = decision.reply or ""
    h.once("reply", lambda: h.gh.comment(h.pr.number, reply))


HEAD_GONE_PURPOSE = "head-gone"


def _show_head_gone(h: Handling, decision: Decision) -> None:
    """The PR's runs cancelled and each auto batch's check at the head saying why nothing
    runs: one check per batch (a cancelled run's own check is reused), no button."""
    output = {"title": "Not run: the head repository was deleted", "summary": decision.summary}
    body = {"status": "completed", "conclusion": "cancelled", "output": output, "actions": []}
    for run in _cancel(h, decision.summary, check=lambda run: body):
        if run.check_run_id and run.sha == decision.sha:
            name = batch_check_name(run.batch)
            runs.record_check(h.conn, h.pr.repo, run.sha, name, HEAD_GONE_PURPOSE, run.check_run_id)
    for batch in h.auto_batches:
        ensure_check(h, decision.sha, batch_check_name(batch), HEAD_GONE_PURPOSE, body)
    h.log(logging.WARNING, "head repository deleted: nothing runs for this PR")


EFFECTS: dict[Effect, Callable[[Handling, Decision], None]] = {
    Effect.CANCEL_RUNS: _cancel_runs,
    Effect.CANCEL_STALE_RUNS: _cancel_stale_runs,
    Effect.VOID_APPROVALS: _void_approvals,
    Effect.REMOVE_LABEL: _remove_label,
    Effect.STORE_APPROVAL: _store_approval,
    Effect.RESET_CHECKS_TO_ACTION_REQUIRED: _reset_checks,
    Effect.REACT_EYES: _react_eyes,
    Effect.POST_STATUS: _post_status,
    Effect.REPLY: _reply,
    Effect.SHOW_HEAD_GONE: _show_head_gone,
}


def status_text(found: list[Run], head_sha: str) -> str:
    """The `/gpuci status` reply: this PR's runs, newest first."""
    if not found:
        return "No gpuci runs on this PR yet."
    lines = [
        f"**gpuci runs** (head `{head_sha[:12]}`)",
        "",
        "| run | batch | commit | state | detail |",
        "|---|---|---|---|---|",
    ]
    for run in sorted(found, key=lambda r: -r.created_at)[:30]:
        detail = run.conclusion or run.wait_reason
        lines.append(
            f"| {run.run_id} | `{run.batch}` | `{run.sha[:10]}` | {run.state} | {detail} |"
        )
    return "\n".join(lines)


# --- runs ------------------------------------------------------------------------------------

TRIGGERS = {
    "label": RunTrigger.APPROVAL,
    "button": RunTrigger.APPROVAL,
    "command": RunTrigger.COMMAND,
    "rerequested": RunTrigger.RERUN,
}


def _active_run(h: Handling, sha: str, batch: str) -> Run | None:
    found = runs.runs_of_pr(h.conn, h.pr.repo, h.pr.number)
    return next((r for r in found if r.sha == sha and r.batch == batch and r.active), None)


def _completed_batches(h: Handling, sha: str) -> set[str]:
    found = runs.runs_of_pr(h.conn, h.pr.repo, h.pr.number)
    return {r.batch for r in found if r.sha == sha and r.state is RunState.COMPLETED}


def _run_fields(h: Handling, sha: str, batch: str) -> dict[str, Any]:
    return {
        "repo": h.pr.repo,
        "installation_id": h.delivery.installation_id,
        "pr": h.pr.number,
        "sha": sha,
        "batch": batch,
        "config_text": h.config_text,
    }


def start_runs(h: Handling, request: RunRequest, trust: str) -> None:
    """One pending run per batch with a queued check run. A batch already queued or running at
    that commit is left alone (and, with `skip_done`, one completed there); one awaiting
    approval becomes pending. Runs of approved code record the approval (who, how, when)."""
    trigger = TRIGGERS.get(request.trigger, RunTrigger.PULL_REQUEST)
    approval = runs.approval_for(h.conn, h.pr.repo, h.pr.number) if trust == "approved" else None
    approval = approval if approval is not None and approval.sha == request.sha else None
    done = _completed_batches(h, request.sha) if request.skip_done else set()
    created = []
    asked_at = time.time()
    for batch in (b for b in request.batches if b not in done):
        run = _active_run(h, request.sha, batch)
        if run is None:
            run = runs.create_run(
                h.conn,
                **_run_fields(h, request.sha, batch),
                trigger=trigger,
                requested_by=request.requested_by,
                wait_reason="waiting for a GPU host",
                trust=trust,
                created_at=asked_at,
                approval=approval,
            )
            created.append(run.run_id)
        elif run.state is RunState.AWAITING_APPROVAL:
            run = runs.mark_pending(h.conn, run, trigger, request.requested_by, trust, approval)
        elif run.state is not RunState.PENDING:
            continue
        run = _show_run(h, run, "queued", _queued_check(h, run))
        h.log(logging.INFO, "run %s: batch %s pending", run.run_id, batch)
    if trigger is RunTrigger.COMMAND:
        runs.record_command_runs(h.conn, h.pr.repo, h.pr.number, created)


# --- pull_request ----------------------------------------------------------------------------


def on_pull_request(ctx: Context, d: Delivery) -> str:
    event = PullRequestEvent.from_payload(d.payload)
    if event.action not in PR_ACTIONS:
        return f"ignored: pull_request.{event.action}"
    h = _handling(ctx, d, event.pr, f"pull_request {event.action} by @{event.sender.login}")
    if event.action in NEW_HEAD_ACTIONS:  # the head became the head at the event's time
        at = epoch(d.payload["pull_request"].get("updated_at")) or time.time()
        runs.note_head(ctx.redis, event.pr.repo, event.pr.number, event.pr.head_sha, at)
    if not load_repo_config(h, check_head=event.action in NEW_HEAD_ACTIONS) and (
        event.action != "closed"
    ):
        return "no usable config"
    label = h.config.approval_label if h.config else DEFAULT_APPROVAL_LABEL
    labelled = event.action in ("labeled", "unlabeled")
    if labelled and event.label != label:
        return f"ignored: label {event.label!r} is not {label!r}"
    decision = decide_pull_request(
        event,
        h.role(event.pr.author) if event.action != "closed" else Role.NONE,
        runs.approval_for(ctx.redis, event.pr.repo, event.pr.number),
        label,
        h.auto_batches,
        sender_role=h.role(event.sender.login) if labelled else Role.NONE,
    )
    return execute(h, decision)


# --- issue_comment ---------------------------------------------------------------------------


def on_issue_comment(ctx: Context, d: Delivery) -> str:
    """Only `created` comments with a /gpuci command, on open PRs, by people, are read."""
    payload = d.payload
    comment = payload["comment"]
    if payload["action"] != "created" or not payload["issue"].get("pull_request"):
        return "ignored: not a new comment on a PR"
    commenter = Actor.from_payload(comment.get("user") or payload.get("sender"))
    if commenter.is_bot(ctx.github.bot_login):
        return f"ignored: comment by bot {commenter.login}"
    if not parse_comment(comment["body"], (), {}):
        return "ignored: no /gpuci command"
    if payload["issue"].get("state") != "open":
        return "ignored: comment on a closed PR"
    repo, number = str(payload["repository"]["full_name"]), int(payload["issue"]["number"])
    gh = ctx.github.repo(d.installation_id, repo)
    role = outsiders.role_of(ctx.redis, gh, repo, commenter.login)
    if not role.can_write:  # decided before fetching anything else
        return _refuse_command(ctx, d, gh, (repo, number), commenter.login, role)
    pr = PullRequest.from_payload(gh.pull(number))
    cause = f"`/gpuci` comment by @{commenter.login}"
    h = Handling(ctx, d, gh, pr, cause, _roles={commenter.login: role})
    h.comment_id = int(comment["id"])
    if not pr.is_open or not load_repo_config(h, check_head=False):
        return "ignored: closed PR or no usable config"
    event = CommentEvent.from_payload(payload, pr, app_login=ctx.github.bot_login)
    return execute(h, _decide_comment(h, event))


def _refuse_command(
    ctx: Context, d: Delivery, gh: RepoClient, pr: tuple[str, int], who: str, role: Role
) -> str:
    """A command from a user without write access: one reply per user and PR an hour (a
    retry of the delivery that replied replies, once), later ones logged only."""
    repo, number = pr
    reply = outsiders.may_reply(ctx.redis, repo, number, who, d.delivery_id)
    decision = refuse_command(repo, who, role, reply=reply)
    log.info("delivery=%s repo=%s pr=%s: %s", d.delivery_id, repo, number, decision.summary)
    if decision.reply is not None:
        text = decision.reply
        _once(ctx.redis, d.delivery_id, "reply", lambda: gh.comment(number, text))
    return str(decision.trust)


def _decide_comment(h: Handling, event: CommentEvent) -> Decision:
    config, pr, conn = h.config, h.pr, h.conn
    assert config is not None  # load_repo_config succeeded
    recent = runs.command_run_times(conn, pr.repo, pr.number)
    # a head gpuci cannot vouch for counts as new since now: after the comment, whatever the clocks
    seen_now = max(time.time(), (event.created_at or 0.0) + 1.0)
    since = runs.head_since(conn, pr.repo, pr.number, pr.head_sha, seen_now)
    return decide_command(
        event,
        author_role=h.role(pr.author),
        commenter_role=h.role(event.commenter.login),
        approval=runs.approval_for(conn, pr.repo, pr.number),
        valid_batches=natural_sorted(config.batches),
        layers={name: layer.batches for name, layer in config.layers.items()},
        auto_batches=config.auto_batches(),
        failed_batches=_failed_batches(h),
        runs_allowed=command_runs_allowed(recent, time.time()),
        head_since=since,
        known_heads=tuple(runs.heads(conn, pr.repo, pr.number)),
    )


def _failed_batches(h: Handling) -> list[str]:
    """Batches whose latest completed run at the head commit failed or timed out."""
    latest: dict[str, Run] = {}
    for run in runs.runs_of_pr(h.conn, h.pr.repo, h.pr.number):
        if run.sha == h.pr.head_sha and run.state is RunState.COMPLETED:
            latest[run.batch] = run
    return natural_sorted(b for b, run in latest.items() if run.conclusion in FAILED)


# --- check_run and check_suite ---------------------------------------------------------------


def on_check_run(ctx: Context, d: Delivery) -> str:
    """The "Approve and run" button and Re-run, on gpuci's batch checks."""
    payload = d.payload
    check = payload["check_run"]
    batch = batch_of_check(check["name"])
    if payload["action"] not in ("requested_action", "rerequested") or batch is None:
        return f"ignored: check_run.{payload['action']} on {check['name']!r}"
    number = _pr_of_check(ctx, check)
    if not number:
        return "ignored: the check belongs to no PR gpuci knows"
    pr = _fetch_pr(ctx, d, number)
    h = _handling(ctx, d, pr, f"check_run {payload['action']} by @{payload['sender']['login']}")
    if not load_repo_config(h, check_head=False):
        return "no usable config"
    action = CheckRunAction.from_payload(payload, pr, batch=batch)
    return execute(h, _decide_button(h, action))


def _pr_of_check(ctx: Context, check: Mapping[str, Any]) -> int:
    """From the run the check reports (external_id; fork PRs are not in pull_requests)."""
    run = (
        runs.get_run(ctx.redis, str(check.get("external_id") or ""))
        if check.get("external_id")
        else None
    )
    if run is not None:
        return run.pr
    pulls = check.get("pull_requests") or []
    return int(pulls[0].get("number") or 0) if pulls else 0


def _decide_button(h: Handling, action: CheckRunAction) -> Decision:
    return decide_button(
        action,
        author_role=h.role(h.pr.author),
        actor_role=h.role(action.actor.login),
        approval=runs.approval_for(h.conn, h.pr.repo, h.pr.number),
        auto_batches=h.auto_batches,
    )


def on_check_suite(ctx: Context, d: Delivery) -> str:
    """Re-run all: every batch gpuci ran at the suite's commit, per PR, as a Re-run of each."""
    payload = d.payload
    if payload["action"] != "rerequested":
        return f"ignored: check_suite.{payload['action']}"
    sha = payload["check_suite"]["head_sha"]
    found = runs.runs_at_sha(ctx.redis, payload["repository"]["full_name"], sha)
    outcomes = []
    for number in sorted({r.pr for r in found if r.pr}):
        pr = _fetch_pr(ctx, d, number)
        h = _handling(ctx, d, pr, f"check_suite rerequested by @{payload['sender']['login']}")
        if not load_repo_config(h, check_head=False):
            continue
        actor = Actor.from_payload(payload.get("sender"))
        for batch in natural_sorted({r.batch for r in found if r.pr == number}):
            action = CheckRunAction("rerequested", pr, sha, actor, batch=batch)
            outcomes.append(execute(h, _decide_button(h, action)))
    return ", ".join(outcomes) or "ignored: no gpuci runs at that commit"


# --- installations ---------------------------------------------------------------------------


def on_installation(ctx: Context, d: Delivery) -> str:
    """installation and installation_repositories: logged and recorded, nothing else."""
    payload = d.payload
    inst = payload["installation"]
    account = str((inst.get("account") or {}).get("login") or "")
    repos = {
        key: [str(r.get("full_name")) for r in payload.get(key) or () if isinstance(r, dict)]
        for key in ("repositories", "repositories_added", "repositories_removed")
    }
    ctx.redis.hset(
        keys.installation(d.installation_id),
        mapping={
            "account": account,
            "action": f"{d.event}.{payload['action']}",
            "repositories": _json(repos),
            "at": str(time.time()),
        },
    )
    log.info(
        "delivery=%s installation=%s account=%s %s.%s %s",
        d.delivery_id, d.installation_id, account, d.event, payload["action"], repos,
    )  # fmt: skip
    return f"recorded {d.event}.{payload['action']}"


def _json(value: object) -> str:
    return json.dumps(value)


HANDLERS: dict[str, Callable[[Context, Delivery], str]] = {
    "pull_request": on_pull_request,
    "issue_comment": on_issue_comment,
    "check_run": on_check_run,
    "check_suite": on_check_suite,
    "installation": on_installation,
    "installation_repositories": on_installation,
}
