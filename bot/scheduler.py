"""`gpuci scheduler`: match pending runs to hosts' idle GPUs, lease them, dispatch to the host."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from redis import Redis

from bot import leader, runs
from bot.github_app import GitHubApp
from bot.hostlink import recover_lost_run
from bot.leader import LEADER_TTL_S, Dispatched, Fence, Leadership
from bot.planner import HostGpuSlot, HostView, PendingRun, Plan, Priority, plan
from bot.reporting import report, report_many
from bot.runs import Run, RunState, RunTrigger
from contract import keys, leases
from contract.config import Batch, ConfigError, HostGpu, Layer, cron_matches, load_config
from contract.hostlink import Ticket
from contract.leases import UNREACHABLE
from contract.redis_errors import redis_problem

log = logging.getLogger("gpuci.scheduler")

TICK_S = 2.0
REDIS_WAIT_MAX_S = 5.0  # the longest wait between rounds while Redis is unreachable
SCHEDULER_TTL_S = 30  # /healthz calls the scheduler gone when its last round is older
HOST_TTL_S = 15  # a host whose heartbeat is older than this is drained (workers.host's TTL)
PENDING_PER_ROUND = 10_000  # the most pending runs one round plans; later ones wait a round
TICKET_MARGIN_S = 900  # a ticket not taken by its batch's timeout + this is not started
PRIORITIES = {
    RunTrigger.PULL_REQUEST: Priority.PULL_REQUEST,
    RunTrigger.SCHEDULE: Priority.SCHEDULED,
}
SourceToken = Callable[[Run], str]


@dataclass
class TickReport:
    """What one scheduling round did, for logs and tests."""

    dispatched: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    requeued: list[str] = field(default_factory=list)


@lru_cache(maxsize=256)
def _config(text: str) -> Any:
    return load_config(text, ".gpuci.yml")


def batch_of(run: Run) -> Batch:
    """The run's batch, from the config text it was decided with (raises ConfigError/KeyError)."""
    batch: Batch = _config(run.config_text).batches[run.batch]
    return batch


def expected_seconds(recorded: list[float], batch: Batch) -> float:
    """Median of the batch's recorded durations in this repository, else its timeout."""
    return statistics.median(recorded) if recorded else float(batch.timeout_s)


@dataclass
class Snapshot:
    """What one round reads from Redis, in a handful of pipelined round trips whatever the
    number of runs and hosts: pending and dispatched runs, durations, served repositories."""

    pending: list[Run]
    dispatched: list[Run]
    durations: dict[tuple[str, str], list[float]]
    repos: dict[str, str]

    @classmethod
    def read(cls, conn: Redis, cache: runs.RunCache | None = None) -> Snapshot:
        """With a `cache` (the scheduler's, kept between rounds) only runs written since the
        last round are read whole."""
        ranked: list[Any] = conn.zrange(keys.pending_runs(), 0, PENDING_PER_ROUND - 1)
        pending_ids = [_text(i) for i in ranked]
        dispatched_ids = sorted(_text(i) for i in conn.smembers(keys.dispatched_runs()))
        read = (cache or runs.RunCache()).get_runs(conn, [*pending_ids, *dispatched_ids])
        both = [r for r in read if r.state is RunState.PENDING or r.state in runs.DISPATCHED]
        pending = [r for r in both if r.state is RunState.PENDING]
        dispatched = [r for r in both if r.state in runs.DISPATCHED]
        durations = runs.durations_of(conn, ((r.repo, r.batch) for r in both))
        repos = {_text(k): _text(v) for k, v in conn.hgetall(keys.repos()).items()}
        return cls(pending, dispatched, durations, repos)

    def expected(self, run: Run) -> float | None:
        """The run's expected duration, None when its batch cannot be read."""
        try:
            batch = batch_of(run)
        except (ConfigError, KeyError):
            return None
        return expected_seconds(self.durations.get((run.repo, run.batch), []), batch)


def host_views(conn: Redis, now: float, snapshot: Snapshot | None = None) -> list[HostView]:
    """Every registered host as the planner sees it: GPUs, idle ones, when leased ones free up."""
    snapshot = snapshot or Snapshot.read(conn)
    names = sorted(_text(n) for n in conn.smembers(keys.hosts()))
    pipe = conn.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.host(name))
        pipe.exists(keys.host_alive(name))
    answers = pipe.execute() if names else []
    records = dict(zip(names, answers[0::2], strict=True))
    alive = {name: bool(a) for name, a in zip(names, answers[1::2], strict=True)}
    gpus = {name: json.loads(r.get(b"gpus", b"[]")) if r else [] for name, r in records.items()}
    held = _lease_holders(conn, gpus)
    ends = _expected_ends(conn, snapshot, held, now)
    busy = Counter(run.host for run in snapshot.dispatched)
    views = []
    for name in names:
        record = records[name]
        view = _view(name, gpus[name], held[name], ends, alive[name])
        slots = int(record.get(b"slots", b"0") or 0) if record else 0
        if slots:
            view = replace(view, free_slots=max(0, slots - busy[name]))
        provides = json.loads(record.get(b"runtimes", b'["base:default"]')) if record else []
        refusing = _text(record.get(b"refusing", b"")) if record else ""
        views.append(replace(view, provides=frozenset(provides), refusing=refusing))
    return views


def _lease_holders(
    conn: Redis, gpus: Mapping[str, list[dict[str, Any]]]
) -> dict[str, dict[int, str | None]]:
    """Host -> GPU index -> the owner of its lease (None: free), in one round trip."""
    wanted = [(name, int(g["index"])) for name, entries in gpus.items() for g in entries]
    values = conn.mget([keys.gpu_lease(n, i) for n, i in wanted]) if wanted else []
    held: dict[str, dict[int, str | None]] = {name: {} for name in gpus}
    for (name, index), value in zip(wanted, values, strict=True):
        held[name][index] = None if value is None else _text(value)
    return held


def _expected_ends(
    conn: Redis, snapshot: Snapshot, held: Mapping[str, Mapping[int, str | None]], now: float
) -> dict[str, float | None]:
    """Lease owner -> when its run should end (None: no such run, or its batch unreadable).
    Owners that are not among the dispatched runs (a run between states) are read at once."""
    by_id = {run.run_id: run for run in snapshot.dispatched}
    owners = {o for leased in held.values() for o in leased.values() if o is not None}
    missing = sorted({leases.run_of(o) for o in owners} - set(by_id))
    if missing:
        extra = runs.get_runs(conn, missing)
        by_id.update({run.run_id: run for run in extra})
        snapshot.durations.update(runs.durations_of(conn, ((r.repo, r.batch) for r in extra)))
    ends: dict[str, float | None] = {}
    for owner in owners:
        run = by_id.get(leases.run_of(owner))
        expected = snapshot.expected(run) if run else None
        ends[owner] = (
            None if run is None or expected is None
            else (run.started_at or run.updated_at or now) + expected
        )  # fmt: skip
    return ends


def _view(
    name: str,
    gpus: list[dict[str, Any]],
    held: Mapping[int, str | None],
    ends: Mapping[str, float | None],
    alive: bool,
) -> HostView:
    slots = [HostGpuSlot(g["index"], _host_gpu(g)) for g in gpus]
    idle = frozenset(g["index"] for g in gpus if g.get("idle") and held.get(g["index"]) is None)
    busy_until = {index: ends[owner] for index, owner in held.items() if owner is not None}
    return HostView(name, slots, idle, busy_until, alive)


def _host_gpu(entry: Mapping[str, Any]) -> HostGpu:
    major, _, minor = str(entry.get("compute_capability") or "0.0").partition(".")
    cc = (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else (0, 0)
    return HostGpu(str(entry.get("name") or ""), int(entry.get("memory_mb") or 0), cc)


def pending_view(conn: Redis, snapshot: Snapshot, report_: TickReport) -> list[PendingRun]:
    """Pending runs for the planner; a run whose batch cannot be read fails at once."""
    found = []
    for run in snapshot.pending:
        try:
            batch = batch_of(run)
        except (ConfigError, KeyError) as exc:
            _fail(conn, run, f"batch {run.batch} cannot be read from the config: {exc}", report_)
            continue
        priority = PRIORITIES.get(run.trigger, Priority.COMMAND)
        runtime = _config(run.config_text).runtime_for(batch)
        recorded = snapshot.durations.get((run.repo, run.batch), [])
        found.append(
            PendingRun(
                run.run_id,
                batch,
                priority,
                run.created_at,
                expected_seconds(recorded, batch),
                needs=runtime.requirement,
                runtime=runtime.name,
            )
        )
    return found


def tick(
    conn: Redis,
    source_token: SourceToken,
    api_url: str,
    now: float | None = None,
    leadership: Leadership | None = None,
    cache: runs.RunCache | None = None,
) -> TickReport:
    """One scheduling round: drain dead hosts, plan, dispatch, and publish wait reasons.

    Reads are pipelined (Snapshot, host_views), so a round makes about a dozen round trips to
    Redis plus one per run dispatched or failed; with the scheduler's `cache` it reads whole
    only the runs written since its last round. With a `leadership` (bot/leader.py) the round
    does nothing unless this process holds the lock, renews it as it goes, and every dispatch
    is refused in Redis itself if the lock moved on meanwhile."""
    now = time.time() if now is None else now
    done = TickReport()
    fence = leadership.keep() if leadership else None
    if leadership is not None and fence is None:
        return done
    conn.set(keys.scheduler_alive(), f"{now:.3f}", ex=SCHEDULER_TTL_S)
    snapshot = Snapshot.read(conn, cache)
    drained = drain_dead_hosts(conn, done, snapshot.dispatched)
    snapshot.dispatched = [r for r in snapshot.dispatched if r.run_id not in drained]
    if drained:
        snapshot.pending = runs.pending_runs(conn, limit=PENDING_PER_ROUND)
    pending = pending_view(conn, snapshot, done)
    if not pending:
        return done
    decided = plan(pending, host_views(conn, now, snapshot), now)
    by_id = {run.run_id: run for run in snapshot.pending}
    _dispatch(conn, decided, by_id, snapshot.repos, source_token, api_url, done, leadership)
    _publish_waits(conn, decided, by_id, done)
    for run_id, reason in decided.unrunnable.items():
        _fail(conn, by_id[run_id], reason, done)
    return done


def _dispatch(
    conn: Redis,
    decided: Plan,
    by_id: Mapping[str, Run],
    repos: Mapping[str, str],
    source_token: SourceToken,
    api_url: str,
    done: TickReport,
    leadership: Leadership | None = None,
) -> None:
    """Dispatch each assignment, one atomic step apiece (bot/leader.py), with the runs as the
    round read them: the step itself refuses a run that is no longer pending. The lock is
    renewed as the round goes (`Leadership.keep`); the step refuses all once it is lost."""
    fence = leadership.fence if leadership else None
    for assignment in decided.assignments:
        if leadership is not None and leadership.keep() != fence:
            log.warning("another scheduler leads now; this one dispatches nothing more")
            return
        run = by_id[assignment.run_id]
        if not runs.may_run(conn, run):
            _fail(
                conn, run, f"refused: commit {run.sha[:10]} is no longer trusted or approved", done
            )
            continue
        served = repos.get(run.repo)
        if served is None or served != str(run.installation_id):
            _fail(
                conn, run, f"refused: gpuci has not heard of {run.repo} in installation "
                f"{run.installation_id}, so it mints no token for it", done,
            )  # fmt: skip
            continue
        try:
            token = source_token(run)
        except Exception as exc:
            log.warning(
                "run=%s repo=%s no source token (%s); retrying next round",
                run.run_id,
                run.repo,
                exc,
            )
            continue
        sent = _send(conn, run, assignment.host, assignment.gpu_indices, token, api_url, fence)
        if sent is Dispatched.NOT_LEADING:
            log.warning("another scheduler leads now; this one dispatches nothing more")
            return
        if sent is Dispatched.DISPATCHED:
            done.dispatched.append(run.run_id)


def _lease_ttl() -> int:
    """Leases taken by the scheduler live until the host's heartbeat takes them over."""
    return 120


def _send(
    conn: Redis,
    run: Run,
    host: str,
    indices: tuple[int, ...],
    token: str,
    api_url: str,
    fence: Fence | None,
) -> Dispatched:
    """Lease the GPUs, assign the run and give the host its ticket, all at once or not at all
    (a GPU leased since the plan, the run changed, or another scheduler leads)."""
    owner = leases.new_owner(run.run_id)
    approval = runs.approval_for(conn, run.repo, run.pr) if run.trust == "approved" else None
    ticket = Ticket(
        run_id=run.run_id,
        repo=run.repo,
        sha=run.sha,
        batch=run.batch,
        config_text=run.config_text,
        gpu_indices=indices,
        lease_owner=owner,
        api_url=api_url,
        source_token=token,
        trust="approved" if run.trust == "approved" else "trusted",
        pr=run.pr,
        approver=approval.approver if approval else "",
        deadline=time.time() + batch_of(run).timeout_s + TICKET_MARGIN_S,
    )
    fields = runs.changed_fields(
        run,
        state=RunState.ASSIGNED,
        host=host,
        gpus=indices,
        lease_owner=owner,
        wait_reason=f"starting on {host}",
    )
    sent = leader.dispatch(
        conn,
        fence,
        run_id=run.run_id,
        host=host,
        indices=indices,
        owner=owner,
        lease_ttl_s=_lease_ttl(),
        fields=fields,
        ticket=ticket.to_json(),
    )
    if sent is Dispatched.DISPATCHED:
        log.info(
            "run=%s repo=%s sha=%s batch=%s host=%s gpus=%s dispatched",
            run.run_id, run.repo, run.sha, run.batch, host, ",".join(map(str, indices)),
        )  # fmt: skip
    return sent


def _publish_waits(conn: Redis, decided: Plan, by_id: Mapping[str, Run], done: TickReport) -> None:
    """Store each waiting run's reason and report it, only where the reason changed: one
    script for all the reasons, one pipeline for all the reports."""
    changed = {}
    for run_id, wait in decided.waiting.items():
        run = by_id[run_id]
        reason = "; ".join(part for part in (run.note, str(wait)) if part)
        done.waiting[run_id] = reason
        if run.wait_reason != reason:
            changed[run_id] = reason
    report_many(conn, runs.set_wait_reasons(conn, changed))


def _fail(conn: Redis, run: Run, reason: str, done: TickReport) -> None:
    runs.finish_run(conn, run, conclusion="failure", title=reason)
    done.failed[run.run_id] = reason
    report(conn, run.run_id)
    log.warning("run=%s repo=%s sha=%s failed: %s", run.run_id, run.repo, run.sha, reason)


def drain_dead_hosts(
    conn: Redis, done: TickReport, dispatched: list[Run] | None = None
) -> set[str]:
    """Runs on a host whose heartbeat stopped: re-queued once, then failed; their ids."""
    dispatched = runs.dispatched_runs(conn) if dispatched is None else dispatched
    hosts = sorted({run.host for run in dispatched if run.host})
    pipe = conn.pipeline(transaction=False)
    for host in hosts:
        pipe.exists(keys.host_alive(host))
    beating = pipe.execute() if hosts else []
    alive = {host for host, found in zip(hosts, beating, strict=True) if found}
    drained = set()
    for run in dispatched:
        if not run.host or run.host in alive:
            continue
        drained.add(run.run_id)
        reason = f"worker lost on {run.host}"
        outcome = recover_lost_run(conn, run, reason)
        if outcome == "requeued":
            done.requeued.append(run.run_id)
        elif outcome == "failed":
            done.failed[run.run_id] = reason
    return drained


# --- scheduled layers ------------------------------------------------------------------------

CONFIG_CACHE_S = 600


@dataclass
class Schedules:
    """Fires layers whose `schedule` matches the current minute, against each repository's
    default-branch head; configs are re-read from GitHub every CONFIG_CACHE_S seconds."""

    conn: Redis
    app: GitHubApp
    configs: dict[str, tuple[float, str]] = field(default_factory=dict)

    def fire(self, now: datetime) -> list[str]:
        """The run ids created for this minute (none twice, whatever runs this)."""
        created: list[str] = []
        for repo, installation in _known_repos(self.conn).items():
            try:
                created += self._fire_repo(repo, installation, now)
            except Exception as exc:  # one repository's trouble must not stop the others
                log.warning("schedules of %s: %s", repo, exc)
        return created

    def _fire_repo(self, repo: str, installation: int, now: datetime) -> list[str]:
        text = self._config_text(repo, installation)
        if not text:
            return []
        try:
            config = _config(text)
        except ConfigError:
            return []  # the events worker reports config errors on PRs
        due = [layer for layer in config.layers.values() if _due(self.conn, repo, layer, now)]
        if not due:
            return []
        _, sha = self.app.repo(installation, repo).default_head()
        fired_at = time.time()
        return [
            _scheduled_run(self.conn, repo, installation, sha, batch, text, layer.name, fired_at)
            for layer in due
            for batch in layer.batches
        ]

    def _config_text(self, repo: str, installation: int) -> str:
        fetched_at, text = self.configs.get(repo, (0.0, ""))
        if time.time() - fetched_at > CONFIG_CACHE_S:
            client = self.app.repo(installation, repo)
            branch, _ = client.default_head()
            text = client.file_text(".gpuci.yml", branch) or ""
            self.configs[repo] = (time.time(), text)
        return text


def _known_repos(conn: Redis) -> dict[str, int]:
    raw = conn.hgetall(keys.repos())
    return {_text(k): int(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _due(conn: Redis, repo: str, layer: Layer, now: datetime) -> bool:
    if not layer.schedule or not cron_matches(layer.schedule, now):
        return False
    minute = now.strftime("%Y%m%d%H%M")
    return bool(conn.set(keys.schedule_fired(repo, layer.name, minute), 1, nx=True, ex=3600))


def _scheduled_run(
    conn: Redis,
    repo: str,
    installation: int,
    sha: str,
    batch: str,
    text: str,
    layer: str,
    fired_at: float,
) -> str:
    run = runs.create_run(
        conn,
        repo=repo,
        installation_id=installation,
        pr=0,
        sha=sha,
        batch=batch,
        trigger=RunTrigger.SCHEDULE,
        requested_by=f"schedule of layer {layer}",
        config_text=text,
        trust="trusted",
        wait_reason="waiting for a GPU host",
        created_at=fired_at,
    )
    report(conn, run.run_id)  # creates its Check Run on the default-branch commit
    log.info(
        "run=%s repo=%s sha=%s batch=%s layer=%s scheduled", run.run_id, repo, sha, batch, layer
    )
    return run.run_id


def stop_on_sigterm() -> Callable[[], bool]:
    """A `stop` for main_loop that SIGTERM (systemd's stop) sets: the round in progress ends,
    the lock is resigned at once and a standby leads within a tick, not a lock TTL."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stopping.set())
    return stopping.is_set


def main_loop(
    conn: Redis,
    source_token: SourceToken,
    api_url: str,
    stop: Callable[[], bool],
    schedules: Schedules | None = None,
    redeliver: Callable[[], list[str]] | None = None,
    leadership: Leadership | None = None,
) -> None:
    """Schedule every TICK_S seconds until `stop()`, firing layer schedules and replaying
    missed webhook deliveries (`redeliver`, see bot/redeliver.py) once a minute, while this
    process holds the leader lock (bot/leader.py); otherwise stand by and try for the lock each
    TICK_S. A failing round is logged, not fatal; while Redis is unreachable (a restart) rounds
    are retried with a growing wait, up to REDIS_WAIT_MAX_S."""
    leadership = leadership or Leadership(conn, ttl_s=LEADER_TTL_S)
    log.info(
        "scheduler %s started (host heartbeat TTL %ss, leader lock TTL %gs)",
        leadership.holder, HOST_TTL_S, leadership.ttl_s,
    )  # fmt: skip
    last = _LastRun()
    wait_s = TICK_S
    try:
        while not stop():
            try:
                if _lead(leadership, last) is not None:
                    _round(conn, source_token, api_url, schedules, redeliver, last, leadership)
                if wait_s > TICK_S:
                    log.info("Redis answers again; scheduling resumed")
                wait_s = TICK_S
            except UNREACHABLE as exc:
                wait_s = min(wait_s * 2, REDIS_WAIT_MAX_S)
                log.warning("Redis %s, retrying in %g s", redis_problem(exc), wait_s)
            except Exception:
                log.exception("scheduling round failed; trying again")
            time.sleep(wait_s)  # a SIGTERM meanwhile stops the loop after this pause
    finally:
        with contextlib.suppress(*UNREACHABLE):  # else the lock lapses within its TTL
            leadership.resign()


def _lead(leadership: Leadership, last: _LastRun) -> Fence | None:
    """Hold the lock for this round, logging when this process starts or stops leading."""
    fence = leadership.hold(time.time())
    term = fence.term if fence else 0
    if term != last.term:
        if fence:
            log.info("scheduler %s leads (term %s)", leadership.holder, term)
        else:
            log.info("scheduler %s stands by: another scheduler leads", leadership.holder)
        last.term = term
    return fence


@dataclass
class _LastRun:
    """The minute (HHMM) layer schedules and the redelivery check last ran; the term held."""

    schedules: str = ""
    redeliver: str = ""
    term: int = -1  # the leadership term held last round, 0 standing by
    run_cache: runs.RunCache = field(default_factory=lambda: runs.RunCache())


def _round(
    conn: Redis,
    source_token: SourceToken,
    api_url: str,
    schedules: Schedules | None,
    redeliver: Callable[[], list[str]] | None,
    last: _LastRun,
    leadership: Leadership | None = None,
) -> None:
    now = datetime.now(UTC)
    minute = now.strftime("%H%M")
    if schedules is not None and minute != last.schedules:
        schedules.fire(now)  # kept from firing by Redis: tried again next round, that minute
        last.schedules = minute
    if redeliver is not None and minute != last.redeliver:
        last.redeliver = minute
        try:
            redone = redeliver()
            if redone:
                log.info("asked GitHub to redeliver %s missed deliveries", len(redone))
        except Exception:
            log.exception("checking for missed webhook deliveries failed; next minute again")
    done = tick(conn, source_token, api_url, leadership=leadership, cache=last.run_cache)
    if done.dispatched or done.failed or done.requeued:
        log.info(
            "round: dispatched %s, failed %s, re-queued %s",
            done.dispatched,
            list(done.failed),
            done.requeued,
        )
