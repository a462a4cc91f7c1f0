"""A GPU host: publish its GPUs to Redis with a heartbeat and execute the runs assigned to it."""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from redis import Redis
from rq import Queue, Retry, Worker
from rq.executions import Execution
from rq.job import Job

from bot import runs
from bot.runs import Run, RunState
from bot.trust import is_sha
from contract import keys, leases
from contract.config import ConfigError, load_config
from contract.leases import UNREACHABLE
from contract.settings import Settings
from workers.batch import BatchResult, conclude_run
from workers.cleanup import disk_problem, finish_workdir, sweep_workdirs, trim_archives
from workers.gpus import GpuBackend, GpuState, gpu_states, inventory_entry, open_backend
from workers.hostsetup import HostSetup, HostSetupError, RuntimeUnavailable
from workers.runner import RunnerError, RunOutcome, RunRequest, resolve_workers, run_batch
from workers.source import SourceError, fetch_archive

log = logging.getLogger("gpuci.worker")
T = TypeVar("T")

HOST_TTL_S = 15  # a host whose heartbeat is older than this is drained by the scheduler
HEARTBEAT_S = 3.0
RESULT_TTL_S = 30 * 24 * 3600
JUNIT_MAX_BYTES = 8 * 1024 * 1024  # compressed; larger JUnit files are not kept (summary is)
REPORTS_QUEUE = "gpuci-reports"
REQUEUE_LIMIT = 1  # a run whose worker was lost is re-queued this many times, then failed
REPORT_JOB = "bot.reports.report_run"
REPORT_RETRY_S = [5, 30, 60, 300, 900, 1800]
REDIS_RETRY_S = (0.5, 1.0, 2.0, 3.0)  # waits while Redis is unreachable (restarting), then 3 s
# How long one step of a run (its start, its result, its completion) waits for an unreachable
# Redis before failing; within the scheduler's job margin (bot.scheduler.JOB_MARGIN_S).
REDIS_PATIENCE_S = 600.0


def host_queue(host: str) -> str:
    """The RQ queue of one GPU host: the scheduler puts that host's runs there."""
    return f"gpuci-host-{host}"


@dataclass(frozen=True)
class Ticket:
    """What the scheduler hands a host for one run: plain values, the only token a
    `contents: read` one for that repository, used only to fetch the archive at the SHA."""

    run_id: str
    gpu_indices: tuple[int, ...]
    lease_owner: str
    api_url: str
    source_token: str

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "gpu_indices": list(self.gpu_indices)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ticket:
        return cls(**{**data, "gpu_indices": tuple(data["gpu_indices"])})


# --- the host's presence ---------------------------------------------------------------------


def publish_host(
    conn: Redis,
    settings: Settings,
    backend: GpuBackend,
    slots: int,
    runtimes: Sequence[str] = ("base:default",),
) -> None:
    """Write this host's GPUs (foreign use only: leases are read from their own keys), the
    runtimes it provides and whether it takes runs (its disk), and renew its heartbeat."""
    states = gpu_states(
        backend,
        {},
        samples=settings.idle_samples,
        interval_s=settings.idle_sample_interval_s,
        idle_memory_mb=settings.idle_memory_mb,
    )
    record: dict[Any, Any] = {
        "gpus": json.dumps([inventory_entry(s) for s in states]),
        "backend": backend.describe(),
        "queue": host_queue(settings.host),
        "slots": str(slots),
        "runtimes": json.dumps(list(runtimes)),
        "refusing": disk_problem(Path(settings.work_dir), settings.bytes_of("min_free_disk")),
        "heartbeat_at": str(time.time()),
        "pid": str(os.getpid()),
    }
    pipe = conn.pipeline()
    pipe.hset(keys.host(settings.host), mapping=record)
    pipe.sadd(keys.hosts(), settings.host)
    pipe.set(keys.host_alive(settings.host), "1", ex=HOST_TTL_S)
    pipe.execute()


class HostHeartbeat(threading.Thread):
    """Publishes the host every HEARTBEAT_S seconds until stopped; logs and retries on errors."""

    def __init__(
        self,
        conn: Redis,
        settings: Settings,
        backend: GpuBackend,
        slots: int,
        runtimes: Sequence[str] = ("base:default",),
    ):
        super().__init__(name="gpuci-host-heartbeat", daemon=True)
        self.conn, self.settings, self.backend, self.slots = conn, settings, backend, slots
        self.runtimes = runtimes
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                publish_host(self.conn, self.settings, self.backend, self.slots, self.runtimes)
            except UNREACHABLE as exc:  # keep beating: a Redis restart must not kill the host
                log.warning(
                    "host heartbeat: Redis unreachable (%s), retrying in %g s", exc, HEARTBEAT_S
                )
            except Exception as exc:
                log.warning("host heartbeat failed: %s", exc)
            self.stopped.wait(HEARTBEAT_S)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=HEARTBEAT_S * 2)


# --- riding out a Redis restart -----------------------------------------------------------------


def through_outage(what: str, step: Callable[[], T], patience_s: float = REDIS_PATIENCE_S) -> T:
    """`step()`, tried again while Redis is unreachable (restarting, loading its data) for up
    to `patience_s`, every wait logged; then the last error is raised. A step must be safe to
    repeat: its reply may have been lost after Redis did it."""
    started, attempt = time.monotonic(), 0
    while True:
        try:
            return step()
        except UNREACHABLE as exc:
            waited = time.monotonic() - started
            delay = REDIS_RETRY_S[min(attempt, len(REDIS_RETRY_S) - 1)]
            if waited + delay > patience_s:
                log.error("%s: Redis unreachable for %.0f s (%s); giving up", what, waited, exc)
                raise
            log.warning("%s: Redis unreachable (%s), retrying in %g s", what, exc, delay)
            time.sleep(delay)
            attempt += 1


class HostWorker(Worker):
    """RQ's forking worker as a GPU host runs it: a Redis restart while a batch runs is waited
    out instead of ending the worker. The batch's horse keeps running and stores its result
    once Redis is back (`through_outage`); RQ's own heartbeat of the job is skipped meanwhile."""

    def maintain_heartbeats(self, job: Job, execution: Execution) -> None:
        try:
            super().maintain_heartbeats(job, execution)
        except UNREACHABLE as exc:
            log.warning("job %s: RQ heartbeat skipped: Redis unreachable (%s)", job.id, exc)

    def monitor_work_horse(self, job: Job, queue: Queue, execution: Execution) -> None:
        while True:
            try:
                return super().monitor_work_horse(job, queue, execution)
            except UNREACHABLE:
                through_outage(f"job {job.id}: watching its horse", self.connection.ping)
                if not self.horse_pid:  # it ended while Redis was away; RQ's cleanup settles it
                    return


# --- one run on this host ---------------------------------------------------------------------


class RunRefused(Exception):
    """The run must not start here; the message says why (it is reported on the Check Run)."""


def execute_run(ticket_json: dict[str, Any]) -> str:
    """The RQ job a host worker executes for one assigned run. Each of its Redis steps waits out
    a Redis restart, so a batch that ends while Redis is down still gets its result stored."""
    settings = Settings.from_env()
    conn = Redis.from_url(settings.redis_url)
    ticket = Ticket.from_json(ticket_json)
    run = through_outage(f"run={ticket.run_id} read it", lambda: runs.get_run(conn, ticket.run_id))
    if run is None or run.state is not RunState.ASSIGNED:
        _release(conn, settings, ticket)
        return f"run {ticket.run_id} is no longer assigned; nothing to do"
    backend = open_backend(settings.gpu_backend) if ticket.gpu_indices else None
    try:
        return _execute(conn, settings, backend, run, ticket)
    finally:
        _release(conn, settings, ticket)
        sweep_workdirs(Path(settings.work_dir), time.time())


def _execute(
    conn: Redis, settings: Settings, backend: GpuBackend | None, run: Run, ticket: Ticket
) -> str:
    tag = f"run={run.run_id}"
    try:
        parts = _request_parts(settings, run)
        through_outage(
            f"{tag} start checks", lambda: _may_start(conn, settings, backend, run, ticket)
        )
    except RunRefused as exc:
        return _requeue(conn, run, str(exc))
    with leases.LeaseHeartbeat(
        conn, settings.host, ticket.gpu_indices, ticket.lease_owner, settings.lease_ttl_s
    ) as heartbeat:
        running = through_outage(f"{tag} mark running", lambda: _mark_running(conn, run, ticket))
        if running is None:
            return f"run {run.run_id} was cancelled before it started"
        _report(conn, run.run_id)
        result = _run(conn, settings, backend, running, ticket, heartbeat.lost, parts)
        _wait_until_free(backend, ticket.gpu_indices, settings.kill_grace_s)
    if heartbeat.lost.is_set():  # the batch was stopped: its GPUs were no longer ours
        result.title = f"Stopped: {heartbeat.reason}"
        through_outage(f"{tag} count the lost lease", lambda: count_lost_lease(conn, "heartbeat"))
    _finish(conn, running, result)
    _clean_up(settings, result)
    return f"run {run.run_id}: {result.conclusion.value} - {result.title}"


def _request_parts(settings: Settings, run: Run) -> dict[str, Any]:
    """The run's environment, sandbox and caches on this host; RunRefused (back to pending,
    for another host) when this one does not provide its runtime."""
    try:
        config = load_config(run.config_text, ".gpuci.yml")
        runtime = config.runtime_for(config.batches[run.batch])
        setup = HostSetup.from_settings(settings, probe=False)
        return setup.request_parts(runtime, run.repo, trusted=run.trust == "trusted")
    except (ConfigError, KeyError):
        return {}  # reported by the run itself, with the config's own errors
    except (HostSetupError, RuntimeUnavailable) as exc:
        raise RunRefused(f"{settings.host}: {exc}") from None


def _clean_up(settings: Settings, result: BatchResult) -> None:
    """The result is stored: the run's directory goes (a failed run's is kept a while)."""
    workdir = result.outcome.workdir
    if workdir == Path(settings.work_dir) or not workdir.is_dir():
        return  # the run never got a directory of its own
    failed = result.conclusion.value not in ("success", "neutral")
    keep = settings.seconds_of("keep_failed_runs")
    finish_workdir(workdir, failed=failed, keep_failed_s=keep, now=time.time())


def _mark_running(conn: Redis, run: Run, ticket: Ticket) -> Run | None:
    """Assigned -> running, or None when the run was cancelled meanwhile. Found running under
    this ticket's lease, it was moved by an earlier try whose reply was lost."""
    moved = runs.transition(
        conn,
        run.run_id,
        {RunState.ASSIGNED},
        state=RunState.RUNNING,
        started_at=time.time(),
        wait_reason="",
    )
    if moved is None:
        now = runs.get_run(conn, run.run_id)
        if now and now.state is RunState.RUNNING and now.lease_owner == ticket.lease_owner:
            return now
    return moved


def _release(conn: Redis, settings: Settings, ticket: Ticket) -> None:
    """Give the run's GPUs back; a Redis away for longer than the lease lets it expire."""
    try:
        through_outage(
            f"run={ticket.run_id} release GPUs",
            lambda: leases.release(conn, settings.host, ticket.gpu_indices, ticket.lease_owner),
            patience_s=settings.lease_ttl_s,
        )
    except UNREACHABLE:
        log.warning("run=%s GPU leases not released; they expire by themselves", ticket.run_id)


def _may_start(
    conn: Redis, settings: Settings, backend: GpuBackend | None, run: Run, ticket: Ticket
) -> None:
    """The worker's own checks at start: SHA, trust, lease, and occupancy under the lease."""
    if not is_sha(run.sha):
        raise RunRefused(f"refused: {run.sha!r} is not a 40-hex commit SHA")
    if not runs.may_run(conn, run):
        raise RunRefused(f"refused: commit {run.sha[:10]} is no longer trusted or approved")
    full = disk_problem(Path(settings.work_dir), settings.bytes_of("min_free_disk"))
    if full:
        raise RunRefused(f"{settings.host} takes no runs: {full}")
    held = leases.holders(conn, settings.host, ticket.gpu_indices)
    if any(owner != ticket.lease_owner for owner in held.values()):
        count_lost_lease(conn, "before_start")
        raise RunRefused(f"the lease on GPUs {list(ticket.gpu_indices)} was lost before start")
    if backend is not None:
        busy = [s for s in _states(settings, backend) if s.gpu.index in ticket.gpu_indices]
        taken = [f"GPU {s.gpu.index}: {'; '.join(s.reasons)}" for s in busy if not s.idle]
        if taken:
            raise RunRefused("GPUs got busy before start (" + ", ".join(taken) + ")")


def _states(settings: Settings, backend: GpuBackend) -> list[GpuState]:
    return gpu_states(
        backend,
        {},
        samples=settings.idle_samples,
        interval_s=settings.idle_sample_interval_s,
        idle_memory_mb=settings.idle_memory_mb,
    )


def _requeue(conn: Redis, run: Run, reason: str) -> str:
    """Back to pending (the scheduler picks again), or failed when the run can never start."""
    through_outage(f"run={run.run_id} not started", lambda: _not_started(conn, run, reason))
    _report(conn, run.run_id)
    log.info("run=%s repo=%s sha=%s not started: %s", run.run_id, run.repo, run.sha, reason)
    return f"run {run.run_id} not started: {reason}"


def _not_started(conn: Redis, run: Run, reason: str) -> None:
    if reason.startswith("refused"):
        runs.finish_run(conn, run, conclusion="failure", title=reason)
    else:
        runs.transition(
            conn,
            run.run_id,
            {RunState.ASSIGNED},
            state=RunState.PENDING,
            wait_reason=reason,
            note=reason,
            host="",
            gpus=(),
            lease_owner="",
        )


def _run(
    conn: Redis,
    settings: Settings,
    backend: GpuBackend | None,
    run: Run,
    ticket: Ticket,
    lease_lost: threading.Event,
    parts: dict[str, Any] | None = None,
) -> BatchResult:
    config = load_config(run.config_text, ".gpuci.yml")
    batch = config.batches[run.batch]
    gpus = [g for g in backend.snapshot() if g.index in ticket.gpu_indices] if backend else []
    cancel = threading.Event()
    watcher = threading.Thread(
        target=_watch_cancel, args=(conn, run.run_id, cancel, lease_lost), daemon=True
    )
    watcher.start()
    try:
        archive = fetch_archive(
            ticket.api_url, run.repo, run.sha, ticket.source_token, _cache_dir(settings)
        )
        trim_archives(_cache_dir(settings), settings.bytes_of("archive_cache_max_size"))
        free = [max(0, (g.memory_total_mb or 0) - (g.memory_used_mb or 0)) for g in gpus]
        request = RunRequest(
            run_id=f"run-{run.run_id}",
            batch=batch,
            config=config,
            source=archive,
            gpu_indices=ticket.gpu_indices,
            work_root=Path(settings.work_dir),
            simulated_gpus=backend.simulated if backend else True,
            workers=resolve_workers(batch, free),
            kill_grace_s=settings.kill_grace_s,
            log_max_bytes=settings.log_max_bytes,
            run_as=settings.run_as,
            gpu_minors=tuple(g.minor_number for g in gpus if g.minor_number is not None),
            gpu_uuids=tuple(g.uuid for g in gpus),
            **(parts or {}),
        )
        outcome = run_batch(request, cancel=cancel, gpu_pids=lambda: _pids_on(backend, ticket))
    except (SourceError, ConfigError, KeyError, RunnerError) as exc:
        outcome = _failed_outcome(settings, str(exc))
    finally:
        cancel.set()  # also stops the watcher
    return conclude_run(settings, batch, run.sha, gpus, outcome)


def _watch_cancel(
    conn: Redis, run_id: str, cancel: threading.Event, lease_lost: threading.Event
) -> None:
    """Poll the run's state; a cancellation (supersede, close, /gpuci cancel) or the loss of its
    GPU leases stops the batch."""
    while not cancel.wait(1.0):
        if lease_lost.is_set():
            log.warning("run=%s GPU lease lost; stopping the batch", run_id)
            cancel.set()
            return
        try:
            run = runs.get_run(conn, run_id)
        except Exception as exc:  # Redis restarting: keep running, look again
            log.warning("run=%s cannot read its state: %s", run_id, exc)
            continue
        if run is not None and run.state is RunState.CANCELLED:
            log.info("run=%s cancelled: %s", run_id, run.wait_reason)
            cancel.set()


def _failed_outcome(settings: Settings, message: str) -> RunOutcome:
    return RunOutcome(
        exit_code=None,
        timed_out=False,
        cancelled=False,
        setup_failed=True,
        preflight_error=message,
        junit_path=None,
        report_path=None,
        log_path=Path(os.devnull),
        log_tail=message,
        log_truncated=False,
        duration_s=0.0,
        workdir=Path(settings.work_dir),
    )


def _cache_dir(settings: Settings) -> Path:
    return Path(settings.work_dir).parent / "archives"


def _pids_on(backend: GpuBackend | None, ticket: Ticket) -> set[int]:
    if backend is None or backend.simulated:
        return set()
    gpus = backend.snapshot()
    return {p.pid for g in gpus if g.index in ticket.gpu_indices for p in g.processes}


def _wait_until_free(backend: GpuBackend | None, indices: tuple[int, ...], grace_s: float) -> None:
    if backend is None or backend.simulated:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(
        g.processes for g in backend.snapshot() if g.index in indices
    ):
        time.sleep(0.5)


def _finish(conn: Redis, run: Run, result: BatchResult) -> None:
    """Store the result and the JUnit XML, complete the run, and ask for the report; each step
    waits out a Redis restart."""
    tag = f"run={run.run_id}"
    through_outage(f"{tag} store the result", lambda: store_result(conn, run.run_id, result))
    log.info(
        "%s repo=%s sha=%s batch=%s finished: %s - %s",
        tag, run.repo, run.sha, run.batch, result.conclusion.value, result.title,
    )  # fmt: skip
    through_outage(f"{tag} complete the run", lambda: _complete(conn, run, result))
    if result.outcome.duration_s and not (result.outcome.cancelled or result.outcome.timed_out):
        seconds = result.outcome.duration_s
        through_outage(
            f"{tag} record its duration",
            lambda: runs.record_duration(conn, run.repo, run.batch, seconds),
        )
    _report(conn, run.run_id)


def _complete(conn: Redis, run: Run, result: BatchResult) -> None:
    current = runs.get_run(conn, run.run_id) or run
    runs.finish_run(conn, current, conclusion=result.conclusion.value, title=result.title)


def _report(conn: Redis, run_id: str) -> None:
    through_outage(f"run={run_id} ask for a report", lambda: report(conn, run_id))


def count_lost_lease(conn: Redis, cause: str) -> None:
    """For /metrics: a run lost its GPU leases (see keys.leases_lost)."""
    conn.hincrby(keys.leases_lost(), cause, 1)


def recover_lost_run(conn: Redis, run: Run, reason: str) -> str:
    """A run whose worker was lost: GPUs released, re-queued once, then failed with `reason`;
    "requeued" or "failed"."""
    leases.release(conn, run.host, run.gpus, run.lease_owner)
    if run.gpus:
        count_lost_lease(conn, "host_lost")
    outcome = "failed"
    if run.attempts < REQUEUE_LIMIT:
        moved = runs.transition(
            conn,
            run.run_id,
            {RunState.ASSIGNED, RunState.RUNNING},
            state=RunState.PENDING,
            attempts=run.attempts + 1,
            host="",
            gpus=(),
            lease_owner="",
            wait_reason=f"re-queued: {reason}",
            note=f"re-queued: {reason}",
        )
        outcome = "requeued" if moved else "gone"
    else:
        runs.finish_run(conn, run, conclusion="failure", title=reason)
    report(conn, run.run_id)
    log.warning("run=%s repo=%s sha=%s %s: %s", run.run_id, run.repo, run.sha, outcome, reason)
    return outcome


def recover_host_runs(conn: Redis, host: str) -> list[str]:
    """At worker start: runs this host was running when its previous worker stopped are lost
    (their processes died with it). Runs only assigned are still in the host's queue."""
    lost = [r for r in runs.dispatched_runs(conn) if r.host == host and r.state is RunState.RUNNING]
    return [r.run_id for r in lost if recover_lost_run(conn, r, f"worker restarted on {host}")]


def store_result(conn: Redis, run_id: str, result: BatchResult) -> None:
    data = result.to_json()
    data["check_output"] = result.output.__dict__
    data["log_tail"] = result.outcome.log_tail
    pipe = conn.pipeline()
    pipe.set(keys.result(run_id), json.dumps(data), ex=RESULT_TTL_S)
    junit = result.outcome.junit_path
    if junit is not None and junit.is_file():
        packed = gzip.compress(junit.read_bytes())
        if len(packed) <= JUNIT_MAX_BYTES:
            pipe.set(keys.junit(run_id), packed, ex=RESULT_TTL_S)
    pipe.execute()


def load_result(conn: Redis, run_id: str) -> dict[str, Any] | None:
    raw = conn.get(keys.result(run_id))
    return json.loads(raw) if raw else None


def report(conn: Redis, run_id: str) -> None:
    """Ask the events worker to bring the run's Check Run up to date; a report that fails (GitHub
    down) is retried for about an hour, and the result itself is already safe in Redis."""
    Queue(REPORTS_QUEUE, connection=conn).enqueue(
        REPORT_JOB, run_id, job_timeout=120, retry=Retry(max=6, interval=REPORT_RETRY_S)
    )
