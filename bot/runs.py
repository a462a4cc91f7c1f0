"""Runs, approvals and the events worker's bookkeeping in Redis (keys in bot/keys.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from redis import Redis
from redis.exceptions import WatchError

from bot.timestamps import iso
from bot.trust import Approval, ApprovalVia
from contract import keys

HEADS_TTL_S = 30 * 24 * 3600
RESULT_TTL_S = 30 * 24 * 3600
CHECK_RECORD_TTL_S = 90 * 24 * 3600
COMMAND_WINDOW_S = 3600
ATTEMPT = "attempt"


class RunState(StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"  # a writer must approve the commit first
    PENDING = "pending"  # waiting for a GPU host (in the pending set)
    ASSIGNED = "assigned"  # a host leased GPUs for it
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


DURATIONS_KEPT = 20
DISPATCHED = frozenset({RunState.ASSIGNED, RunState.RUNNING})
ACTIVE = frozenset(
    {RunState.AWAITING_APPROVAL, RunState.PENDING, RunState.ASSIGNED, RunState.RUNNING}
)


class RunTrigger(StrEnum):
    PULL_REQUEST = "pull_request"
    COMMAND = "command"
    RERUN = "rerun"
    APPROVAL = "approval"
    SCHEDULE = "schedule"


# Lower runs first: automatic PR runs, then what a person asked for, then schedules.
PRIORITY = {
    RunTrigger.PULL_REQUEST: 0,
    RunTrigger.COMMAND: 1,
    RunTrigger.RERUN: 1,
    RunTrigger.APPROVAL: 1,
    RunTrigger.SCHEDULE: 2,
}


@dataclass(frozen=True)
class Run:
    """One batch at one commit. `pr` is 0 for default-branch (scheduled) runs; `config_text` is
    the default branch's .gpuci.yml the run was decided with; `check_run_id` its Check Run."""

    run_id: str
    repo: str
    installation_id: int
    pr: int
    sha: str
    batch: str
    trigger: RunTrigger
    requested_by: str
    state: RunState
    created_at: float
    updated_at: float
    config_text: str = ""
    check_run_id: int = 0
    conclusion: str = ""
    title: str = ""
    wait_reason: str = ""
    host: str = ""
    gpus: tuple[int, ...] = field(default=())
    trust: str = ""  # "trusted" or "approved": what let it run (the worker checks it again)
    lease_owner: str = ""  # the owner token of its GPU leases while assigned or running
    attempts: int = 0  # times it was re-queued because its host was lost
    started_at: float = 0.0
    finished_at: float = 0.0
    note: str = ""  # why it was sent back to pending (shown before its wait reason)
    approved_by: str = ""  # for runs of approved commits: who approved, how, when
    approved_via: str = ""  # label, button or command
    approved_at: float = 0.0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def approval_text(self) -> str:
        """The audit line of an approved run: `Approved by maya (label, 2026-05-01T10:00:00Z)`;
        empty for runs that needed no approval."""
        if not self.approved_by:
            return ""
        return f"Approved by {self.approved_by} ({self.approved_via}, {iso(self.approved_at)})"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = list(self.gpus)
        return data


def _encode(run: Run) -> dict[Any, Any]:
    return {k: json.dumps(list(v)) if k == "gpus" else str(v) for k, v in asdict(run).items()}


_TYPES = {f.name: f.type for f in fields(Run)}


def _decode(raw: dict[bytes | str, bytes | str]) -> Run:
    data = {_text(k): _text(v) for k, v in raw.items()}
    values: dict[str, Any] = {}
    for name, kind in _TYPES.items():
        text = data.get(name, "")
        if name == "gpus":
            values[name] = tuple(json.loads(text or "[]"))
        elif kind in ("int",):
            values[name] = int(text or 0)
        elif kind == "float":
            values[name] = float(text or 0)
        else:
            values[name] = text
    values["trigger"] = RunTrigger(values["trigger"])
    values["state"] = RunState(values["state"])
    return Run(**values)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _score(run: Run) -> float:
    return PRIORITY[run.trigger] * 1e10 + run.created_at


# --- runs ------------------------------------------------------------------------------------


def create_run(
    conn: Redis,
    *,
    repo: str,
    installation_id: int,
    pr: int,
    sha: str,
    batch: str,
    trigger: RunTrigger,
    requested_by: str,
    state: RunState = RunState.PENDING,
    config_text: str = "",
    wait_reason: str = "",
    trust: str = "",
    created_at: float | None = None,
    approval: Approval | None = None,
) -> Run:
    """A new run with the next id, indexed by PR and commit; pending runs join the pending set.
    Runs asked for together share `created_at`, so the planner orders them by size, not by
    the order they were written in."""
    now = time.time() if created_at is None else created_at
    run = Run(
        run_id=str(conn.incr(keys.run_counter())),
        repo=repo,
        installation_id=installation_id,
        pr=pr,
        sha=sha,
        batch=batch,
        trigger=trigger,
        requested_by=requested_by,
        state=state,
        created_at=now,
        updated_at=now,
        config_text=config_text,
        wait_reason=wait_reason,
        trust=trust,
        **approved_fields(approval),
    )
    pipe = conn.pipeline()
    pipe.hset(keys.run(run.run_id), mapping=_encode(run))
    pipe.zadd(keys.all_runs(), {run.run_id: now})
    pipe.zadd(keys.pr_runs(repo, pr), {run.run_id: now})
    pipe.sadd(keys.sha_runs(repo, sha), run.run_id)
    if state is RunState.PENDING:
        pipe.zadd(keys.pending_runs(), {run.run_id: _score(run)})
    pipe.execute()
    return run


def get_run(conn: Redis, run_id: str) -> Run | None:
    raw = conn.hgetall(keys.run(run_id))
    return _decode(raw) if raw else None


def update_run(conn: Redis, run: Run, **changes: Any) -> Run:
    """Store changed fields on the run as it is now in Redis (not as `run` last saw it); the
    pending and dispatched sets follow the state."""
    return transition(conn, run.run_id, set(RunState), **changes) or replace(run, **changes)


def _index_state(pipe: Any, run: Run) -> None:
    """The pending set and the dispatched set follow the run's state."""
    if run.state is RunState.PENDING:
        pipe.zadd(keys.pending_runs(), {run.run_id: _score(run)})
    else:
        pipe.zrem(keys.pending_runs(), run.run_id)
    if run.state in DISPATCHED:
        pipe.sadd(keys.dispatched_runs(), run.run_id)
    else:
        pipe.srem(keys.dispatched_runs(), run.run_id)


def transition(conn: Redis, run_id: str, allowed: set[RunState], **changes: Any) -> Run | None:
    """Change a run only if its state is one of `allowed` (checked and written atomically, so a
    cancellation is never overwritten by a worker); None when it was not."""
    key = keys.run(run_id)
    with conn.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                raw = pipe.hgetall(key)
                if not raw or _decode(raw).state not in allowed:
                    return None
                updated = replace(_decode(raw), **changes, updated_at=time.time())
                encoded = _encode(updated)
                pipe.multi()
                pipe.hset(key, mapping={k: encoded[k] for k in (*changes, "updated_at")})
                _index_state(pipe, updated)
                pipe.execute()
                return updated
            except WatchError:
                continue


def changed_fields(run: Run, **changes: Any) -> dict[str, str]:
    """The hash fields `transition` would write for `changes`, `updated_at` included, for a
    write that must be made in one script with others (bot/leader.py's dispatch)."""
    encoded = _encode(replace(run, **changes, updated_at=time.time()))
    return {k: encoded[k] for k in (*changes, "updated_at")}


def finish_run(conn: Redis, run: Run, *, conclusion: str, title: str) -> Run:
    """A run is over: completed with its conclusion, or kept cancelled if it was cancelled."""
    active = ACTIVE | {RunState.COMPLETED}
    done = transition(
        conn,
        run.run_id,
        set(active),
        state=RunState.COMPLETED,
        conclusion=conclusion,
        title=title,
        finished_at=time.time(),
        lease_owner="",
    )
    if done is not None:
        return done
    kept = transition(
        conn,
        run.run_id,
        {RunState.CANCELLED},
        title=title,
        finished_at=time.time(),
        lease_owner="",
    )
    return kept or run


def dispatched_runs(conn: Redis) -> list[Run]:
    """Runs assigned to a host or running there."""
    return _runs(conn, conn.smembers(keys.dispatched_runs()))


def may_run(conn: Redis, run: Run) -> bool:
    """The scheduler's trust check before dispatch: default-branch runs, runs decided trusted,
    or runs whose PR's current approval covers exactly this commit (the host re-checks the
    latter with GitHub before it starts)."""
    if run.state is RunState.CANCELLED:
        return False
    if run.pr == 0:
        return run.trigger is RunTrigger.SCHEDULE
    if run.trust == "trusted":
        return True
    approval = approval_for(conn, run.repo, run.pr)
    return approval is not None and approval.sha == run.sha


def record_duration(conn: Redis, repo: str, batch: str, seconds: float) -> None:
    """Keep the batch's last DURATIONS_KEPT durations (the scheduler plans with their median)."""
    key = keys.durations(repo, batch)
    pipe = conn.pipeline()
    pipe.lpush(key, f"{seconds:.3f}")
    pipe.ltrim(key, 0, DURATIONS_KEPT - 1)
    pipe.execute()


def durations(conn: Redis, repo: str, batch: str) -> list[float]:
    return [float(_text(v)) for v in conn.lrange(keys.durations(repo, batch), 0, -1)]


def durations_of(
    conn: Redis, batches: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], list[float]]:
    """(repo, batch) -> its recorded durations, for many batches in one round trip."""
    wanted = sorted(set(batches))
    pipe = conn.pipeline(transaction=False)
    for repo, batch in wanted:
        pipe.lrange(keys.durations(repo, batch), 0, -1)
    found = pipe.execute() if wanted else []
    return {k: [float(_text(v)) for v in values] for k, values in zip(wanted, found, strict=True)}


# KEYS: run hashes. ARGV: updated_at, then one wait reason per run. Set each run's reason only
# if it is still pending; returns 1 or 0 per run.
_SET_WAITS = """
local written = {}
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'state') == 'pending' then
    redis.call('HSET', key, 'wait_reason', ARGV[i + 1], 'updated_at', ARGV[1])
    written[i] = 1
  else
    written[i] = 0
  end
end
return written
"""


def set_wait_reasons(conn: Redis, reasons: Mapping[str, str]) -> list[str]:
    """Store the wait reasons of runs still pending, all in one step; the run ids written."""
    ids = list(reasons)
    if not ids:
        return []
    now = str(time.time())
    flags = conn.eval(
        _SET_WAITS, len(ids), *(keys.run(i) for i in ids), now, *(reasons[i] for i in ids)
    )
    return [run_id for run_id, flag in zip(ids, flags, strict=True) if flag]


def mark_pending(
    conn: Redis,
    run: Run,
    trigger: RunTrigger,
    requested_by: str,
    trust: str = "",
    approval: Approval | None = None,
) -> Run:
    """An approved run: now it waits for a GPU host."""
    return update_run(
        conn,
        run,
        state=RunState.PENDING,
        trigger=trigger,
        requested_by=requested_by,
        wait_reason="waiting for a GPU host",
        trust=trust,
        **approved_fields(approval),
    )


def approved_fields(approval: Approval | None) -> dict[str, Any]:
    """The run's record of the approval that lets it run (none: empty fields)."""
    if approval is None:
        return {"approved_by": "", "approved_via": "", "approved_at": 0.0}
    return {
        "approved_by": approval.approver,
        "approved_via": str(approval.via),
        "approved_at": approval.at,
    }


def mark_awaiting(conn: Redis, run: Run, reason: str) -> Run:
    """A run that needs a writer's approval of its commit before it may wait for a host."""
    return update_run(conn, run, state=RunState.AWAITING_APPROVAL, wait_reason=reason)


def _runs(conn: Redis, run_ids: Iterable[Any]) -> list[Run]:
    """The runs that exist among `run_ids`, read in one round trip."""
    ids = [_text(i) for i in run_ids]
    if not ids:
        return []
    pipe = conn.pipeline(transaction=False)
    for run_id in ids:
        pipe.hgetall(keys.run(run_id))
    return [_decode(raw) for raw in pipe.execute() if raw]


def get_runs(conn: Redis, run_ids: Iterable[str]) -> list[Run]:
    """The runs that exist among `run_ids`, in one round trip."""
    return _runs(conn, run_ids)


class RunCache:
    """Runs as last read, re-read only when their `updated_at` changed: every write to a run
    (create_run, transition and the scripts here and in bot/leader.py) sets it. A process that
    reads the same thousands of runs every few seconds (the scheduler) then reads one field of
    each instead of the whole hash."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self.stamps: dict[str, bytes] = {}

    def get_runs(self, conn: Redis, run_ids: Iterable[str]) -> list[Run]:
        """The runs that exist among `run_ids`, in order, in two round trips; runs not asked
        for are forgotten."""
        ids = list(dict.fromkeys(run_ids))
        pipe = conn.pipeline(transaction=False)
        for run_id in ids:
            pipe.hget(keys.run(run_id), "updated_at")
        stamps = dict(zip(ids, pipe.execute() if ids else [], strict=True))
        stale = [i for i in ids if stamps[i] is not None and self.stamps.get(i) != stamps[i]]
        fresh = dict(zip(stale, _runs_or_none(conn, stale), strict=True))
        found: dict[str, Run] = {}
        for run_id in ids:
            run = fresh[run_id] if run_id in fresh else self.runs.get(run_id)
            if stamps[run_id] is not None and run is not None:
                found[run_id] = run
        self.runs, self.stamps = found, {i: stamps[i] for i in found}
        return list(found.values())


def _runs_or_none(conn: Redis, run_ids: list[str]) -> list[Run | None]:
    pipe = conn.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hgetall(keys.run(run_id))
    return [_decode(raw) if raw else None for raw in (pipe.execute() if run_ids else [])]


def runs_of_pr(conn: Redis, repo: str, number: int) -> list[Run]:
    """Every run of a PR, oldest first."""
    return _runs(conn, conn.zrange(keys.pr_runs(repo, number), 0, -1))


def runs_at_sha(conn: Redis, repo: str, sha: str) -> list[Run]:
    """Every run at one commit, oldest first."""
    found = _runs(conn, conn.smembers(keys.sha_runs(repo, sha)))
    return sorted(found, key=lambda r: r.created_at)


def pending_runs(conn: Redis, limit: int = 100) -> list[Run]:
    """Runs waiting for a GPU host, the next one first."""
    return _runs(conn, conn.zrange(keys.pending_runs(), 0, limit - 1))


def list_runs(conn: Redis, limit: int = 100) -> list[Run]:
    """The newest runs, newest first."""
    return _runs(conn, conn.zrevrange(keys.all_runs(), 0, limit - 1))


def cancel_runs(
    conn: Redis, repo: str, number: int, reason: str, *, keep_sha: str | None = None
) -> list[Run]:
    """Cancel a PR's active runs (all, or those not at `keep_sha`); the cancelled ones."""
    cancelled = []
    for run in runs_of_pr(conn, repo, number):
        if run.active and run.sha != keep_sha:
            done = update_run(
                conn, run, state=RunState.CANCELLED, conclusion="cancelled", wait_reason=reason
            )
            if run.host:  # its host stops it (contract.keys.host_cancel)
                conn.sadd(keys.host_cancel(run.host), run.run_id)
            cancelled.append(done)
    return cancelled


# --- results (what the bot made of a host's report) -------------------------------------------


def final_updates_sent(conn: Redis, run_id: str) -> int:
    """How many of the run's final (completed) Check Run updates GitHub has got."""
    return int(conn.get(keys.reported(run_id)) or 0)


def record_final_updates(conn: Redis, run_id: str, count: int) -> None:
    conn.set(keys.reported(run_id), count, ex=RESULT_TTL_S)


def store_result(conn: Redis, run_id: str, data: dict[str, Any]) -> None:
    """A finished run's summary JSON, Check Run output and log tail (30 days)."""
    conn.set(keys.result(run_id), json.dumps(data), ex=RESULT_TTL_S)


def load_result(conn: Redis, run_id: str) -> dict[str, Any] | None:
    raw = conn.get(keys.result(run_id))
    if not raw:
        return None
    data = json.loads(raw)
    return data if isinstance(data, dict) else None


# --- approvals and heads ---------------------------------------------------------------------


def store_approval(conn: Redis, approval: Approval) -> None:
    """The PR's approval (it replaces an older one: an approval covers one commit)."""
    mapping: dict[Any, Any] = {
        "sha": approval.sha,
        "approver": approval.approver,
        "via": str(approval.via),
        "at": repr(approval.at or time.time()),
    }
    conn.hset(keys.approval(approval.repo, approval.number), mapping=mapping)


def approval_for(conn: Redis, repo: str, number: int) -> Approval | None:
    raw = conn.hgetall(keys.approval(repo, number))
    if not raw:
        return None
    data = {_text(k): _text(v) for k, v in raw.items()}
    at = float(data.get("at") or 0)
    return Approval(repo, number, data["sha"], data["approver"], ApprovalVia(data["via"]), at)


def void_approvals(conn: Redis, repo: str, number: int) -> bool:
    """Forget the PR's approval; True if there was one."""
    return bool(conn.delete(keys.approval(repo, number)))


# Keeps, per head, the latest time it became the head: a force-push back to an older commit
# moves that commit's time forward, and a redelivered old event cannot move it back.
_NOTE_HEAD = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old or tonumber(old) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
"""


def note_head(conn: Redis, repo: str, number: int, sha: str, at: float) -> None:
    """`sha` became the PR's head at `at` (a webhook's time, or when gpuci saw it)."""
    conn.eval(_NOTE_HEAD, 1, keys.heads(repo, number), sha, repr(at), HEADS_TTL_S)


def heads(conn: Redis, repo: str, number: int) -> dict[str, float]:
    """Every head gpuci knows the PR had, with when it most recently became the head."""
    raw = conn.hgetall(keys.heads(repo, number))
    return {_text(sha): float(_text(at)) for sha, at in raw.items()}


def head_since(conn: Redis, repo: str, number: int, sha: str, now: float) -> float:
    """Since when `sha` has been the PR's head without a break, as far as gpuci can tell: the
    latest time it became the head, if no other head came after that. Otherwise (gpuci never
    saw it become the head, or another head came later, so it came back unseen) `now`, which
    is recorded as its time."""
    known = heads(conn, repo, number)
    at = known.get(sha)
    if at is not None and all(t < at for s, t in known.items() if s != sha):
        return at
    note_head(conn, repo, number, sha, now)
    return max(now, at or now)


# --- the per-PR rate rule of command runs ----------------------------------------------------


def record_command_runs(conn: Redis, repo: str, number: int, run_ids: Sequence[str]) -> None:
    if run_ids:
        now = time.time()
        key = keys.command_runs(repo, number)
        conn.zadd(key, dict.fromkeys(run_ids, now))
        conn.expire(key, COMMAND_WINDOW_S * 2)


def command_run_times(conn: Redis, repo: str, number: int) -> list[float]:
    """Start times of the PR's command-triggered runs in the last window (older ones dropped)."""
    key = keys.command_runs(repo, number)
    conn.zremrangebyscore(key, "-inf", time.time() - COMMAND_WINDOW_S)
    found: list[tuple[bytes, float]] = conn.zrange(key, 0, -1, withscores=True)  # type: ignore[assignment]
    return [score for _, score in found]


# --- check run records -----------------------------------------------------------------------


def recorded_check(conn: Redis, repo: str, sha: str, name: str, purpose: str) -> int | str | None:
    """The check run id gpuci made for `purpose`; "attempt" if a create may have been sent."""
    raw = conn.hget(keys.check_runs(repo, sha, name), purpose)
    if raw is None:
        return None
    text = _text(raw)
    return ATTEMPT if text == ATTEMPT else int(text)


def record_check(
    conn: Redis, repo: str, sha: str, name: str, purpose: str, check_run_id: int | str
) -> None:
    """Record a check run id (or ATTEMPT, just before sending the create)."""
    key = keys.check_runs(repo, sha, name)
    conn.hset(key, purpose, str(check_run_id))
    conn.expire(key, CHECK_RECORD_TTL_S)
