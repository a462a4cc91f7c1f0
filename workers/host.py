"""A GPU host: publish its GPUs with a heartbeat, take the tickets the scheduler gives it, run
each batch in a process of its own, and tell the bot what happened, all as data on the host's
own Redis keys (contract.hostlink). A host's Redis login reaches nothing else."""

from __future__ import annotations

import gzip
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests
from redis import Redis
from redis.exceptions import RedisError

from contract import keys, leases
from contract.config import Batch, Config, ConfigError, Runtime, load_config
from contract.hostlink import MAX_TEXT, HostMessage, Kind, ProtocolError, Ticket
from contract.leases import UNREACHABLE
from contract.redact import redact_text
from contract.redis_errors import connect, redis_problem
from contract.roles import is_sha, role_from_api
from contract.settings import Settings
from workers import faults
from workers.batch import BatchResult, conclude_run, run_request
from workers.cleanup import disk_problem, finish_workdir, sweep_workdirs, trim_archives
from workers.gpus import GpuBackend, GpuState, gpu_states, inventory_entry, open_backend
from workers.hostsetup import HostSetup, HostSetupError, RuntimeUnavailable
from workers.runner import RunnerError, RunOutcome, run_batch
from workers.source import SourceError, fetch_archive

log = logging.getLogger("gpuci.worker")
T = TypeVar("T")

HOST_TTL_S = 15  # a host whose heartbeat is older than this is drained by the scheduler
HEARTBEAT_S = 3.0
JUNIT_MAX_BYTES = 8 * 1024 * 1024  # compressed; larger JUnit files are not kept (summary is)
ERROR_LOG_TAIL_BYTES = 16 * 1024  # of a crashed run's log, sent with the error
REDIS_RETRY_S = (0.5, 1.0, 2.0, 3.0)  # waits while Redis is unreachable (restarting), then 3 s
# How long one step of a run (its start, its result, its completion) waits for an unreachable
# Redis before failing.
REDIS_PATIENCE_S = 600.0
TAKE_WAIT_S = 1  # seconds: how long the main loop blocks for the next ticket
# Set in a run's process by SIGTERM (the worker is stopping): the batch stops, and the bot
# hears that it did not finish (it re-queues it once) rather than a result.
SHUTDOWN = threading.Event()


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
                why = redis_problem(exc)
                log.warning("host heartbeat: Redis %s, retrying in %g s", why, HEARTBEAT_S)
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
                log.error("%s: Redis %s for %.0f s; giving up", what, redis_problem(exc), waited)
                raise
            log.warning("%s: Redis %s, retrying in %g s", what, redis_problem(exc), delay)
            time.sleep(delay)
            attempt += 1


def send(conn: Redis, host: str, message: HostMessage) -> None:
    """Tell the bot something (the host's outbox, oldest message first out)."""
    raw = message.to_json()
    through_outage(
        f"run={message.run_id or '-'} send {message.kind}",
        lambda: conn.lpush(keys.host_outbox(host), raw),
    )


# --- the host's loop: tickets in, one process per run ----------------------------------------


class Host:
    """Takes tickets from this host's list while it has free slots and runs each one in a
    process of its own (`gpuci worker` runs this); SIGTERM stops taking and waits for the runs,
    which the worker's grace then kills with its cgroup. One spare process, started ahead with
    its imports done (about 0.6 s), waits on its stdin for the next ticket."""

    def __init__(self, conn: Redis, settings: Settings, slots: int):
        self.conn, self.settings, self.slots = conn, settings, slots
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.spare: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()

    def start(self) -> list[str]:
        """At start: tickets taken by a previous worker that died are lost; the bot hears it."""
        host = self.settings.host
        taken = through_outage(
            "read taken tickets", lambda: self.conn.lrange(keys.host_taken(host), 0, -1)
        )
        lost = []
        for raw in taken:
            try:
                ticket = Ticket.from_json(raw)
            except ProtocolError:
                continue
            reason = f"worker restarted on {host}"
            send(
                self.conn,
                host,
                HostMessage(
                    Kind.NOT_STARTED, ticket.run_id, ticket.lease_owner, reason, retry=True
                ),
            )
            lost.append(ticket.run_id)
        through_outage("clear taken tickets", lambda: self.conn.delete(keys.host_taken(host)))
        send(self.conn, host, HostMessage(Kind.HELLO, reason=f"pid {os.getpid()}"))
        return lost

    def serve(self, *, burst: bool = False) -> None:
        """Run tickets until SIGTERM (or, with `burst`, until none is left)."""
        while not self.stopping.is_set():
            self._reap()
            if len(self.children) >= self.slots:
                time.sleep(0.2)
                continue
            raw = self._take()
            if raw is None:
                if burst and not self.children:
                    return
                continue
            self._spawn(raw)
        self._retire_spare()
        self._wait_for_children()

    def stop(self, *_args: object) -> None:
        """Take no more tickets; each run stops its batch and tells the bot it did not end."""
        self.stopping.set()
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def _take(self) -> bytes | None:
        host = self.settings.host
        try:
            raw: bytes | None = self.conn.blmove(  # type: ignore[assignment]
                keys.host_tickets(host),
                keys.host_taken(host),
                TAKE_WAIT_S,
                "RIGHT",
                "LEFT",
            )
        except UNREACHABLE as exc:
            log.warning("taking tickets: Redis %s, retrying", redis_problem(exc))
            time.sleep(REDIS_RETRY_S[-1])
            return None
        return raw

    def _start_child(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.host"], stdin=subprocess.PIPE, start_new_session=False
        )

    def _spawn(self, raw: bytes) -> None:
        """The run in a fresh `python -m workers.host` process (the spare, if it is alive); the
        ticket on its stdin (never its command line: the source token must not show in `ps`).
        Then the next spare."""
        child = self.spare if self.spare is not None and self.spare.poll() is None else None
        child = child or self._start_child()
        self.spare = None
        assert child.stdin is not None
        try:
            child.stdin.write(raw)
            child.stdin.close()
        except BrokenPipeError:  # the spare died (killed by hand?): the ticket stays taken
            log.error("the run process %s exited before its ticket was given", child.pid)
        self.spare = self._start_child()
        try:
            run_id = str(json.loads(raw).get("run_id", "?"))
        except ValueError:
            run_id = "?"
        self.children[f"{run_id}:{child.pid}"] = child

    def _reap(self) -> None:
        for name, child in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            del self.children[name]
            if code != 0 and not self.stopping.is_set():
                self._run_process_died(name.partition(":")[0], code)

    def _run_process_died(self, run_id: str, code: int) -> None:
        """A run's process died without ending its run (killed, out of memory): the bot hears
        it as a gpuci error, and its ticket is forgotten."""
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        log.error("run=%s its process died (%s)", run_id, how)
        ticket = self._taken_ticket(run_id)
        if ticket is None:  # it had ended its run and forgotten the ticket before dying
            return
        failure = RuntimeError(f"the run's process on {self.settings.host} died ({how})")
        if _crashed(self.conn, self.settings, ticket, failure):
            through_outage(
                f"run={run_id} forget the ticket",
                lambda: _forget(self.conn, self.settings.host, ticket),
            )

    def _taken_ticket(self, run_id: str) -> Ticket | None:
        host = self.settings.host
        taken = through_outage(
            "read taken tickets", lambda: self.conn.lrange(keys.host_taken(host), 0, -1)
        )
        for raw in taken:
            try:
                ticket = Ticket.from_json(raw)
            except ProtocolError:
                continue
            if ticket.run_id == run_id:
                return ticket
        return None

    def _retire_spare(self) -> None:
        """End the spare: an empty stdin tells it there is no ticket."""
        if self.spare is not None:
            assert self.spare.stdin is not None
            self.spare.stdin.close()
            self.spare.wait()
            self.spare = None

    def _wait_for_children(self) -> None:
        for child in self.children.values():
            child.wait()
        self.children.clear()


def work_burst(conn: Redis, settings: Settings) -> int:
    """Run every ticket of this host in this process, one after another (tests, `--burst`)."""
    done = 0
    host = settings.host
    while True:
        raw = conn.lmove(keys.host_tickets(host), keys.host_taken(host), "RIGHT", "LEFT")
        if raw is None:
            return done
        run_ticket(conn, settings, raw if isinstance(raw, bytes) else str(raw).encode())
        done += 1


def main() -> int:
    """`python -m workers.host`: run the one ticket on stdin (a child of `gpuci worker`)."""
    from contract.logs import configure

    settings = Settings.from_env()
    configure(settings.log_format)
    raw = sys.stdin.buffer.read()  # a spare waits here, its imports done
    if not raw:
        return 0  # the worker is stopping: no ticket came
    conn = connect(settings.redis_url)  # a refused command names its key
    signal.signal(signal.SIGTERM, lambda *_: SHUTDOWN.set())
    run_ticket(conn, settings, raw)
    return 0


# --- one run on this host ---------------------------------------------------------------------


class RunRefused(Exception):
    """The run must not start here; `retry` sends it back to pending (another host may)."""

    def __init__(self, reason: str, *, retry: bool):
        super().__init__(reason)
        self.retry = retry


def run_ticket(conn: Redis, settings: Settings, raw: bytes) -> str:
    """Everything a host does with one ticket, each Redis step riding out a restart: check,
    tell the bot it starts, run, upload the JUnit XML, tell the bot how it ended, release the
    GPUs, forget the ticket."""
    host = settings.host
    try:
        ticket = Ticket.from_json(raw)
    except ProtocolError as exc:
        log.error("refusing a ticket that is not one (%s)", exc)
        through_outage("drop a bad ticket", lambda: conn.lrem(keys.host_taken(host), 1, raw))  # type: ignore[arg-type]
        return f"bad ticket: {exc}"
    told = True  # whether the bot heard how the run ended
    try:
        backend = open_backend(settings.gpu_backend) if ticket.gpu_indices else None
        return _execute(conn, settings, backend, ticket)
    except Exception as exc:  # whatever raises on the run path ends the run, visibly
        told = _crashed(conn, settings, ticket, exc)
        return f"run {ticket.run_id}: gpuci error: {exc}"
    finally:
        _release(conn, settings, ticket)
        if told:  # else the ticket stays taken: the worker's next start reports the run lost
            through_outage(
                f"run={ticket.run_id} forget the ticket",
                lambda: _forget(conn, host, ticket),
            )
        sweep_workdirs(Path(settings.work_dir), time.time())


def _crashed(conn: Redis, settings: Settings, ticket: Ticket, exc: Exception) -> bool:
    """gpuci's own code raised while it held the run: the bot hears it, with the run's log so
    far, and fails the run ("gpuci error on HOST: ..."); the traceback goes to this log.
    Whether the bot could be told."""
    log.error(
        "run=%s repo=%s sha=%s gpuci error", ticket.run_id, ticket.repo, ticket.sha, exc_info=exc
    )
    if isinstance(exc, RedisError):  # "Redis permission denied: for SET on key ...", ...
        what = f"Redis {redis_problem(exc)}"[:MAX_TEXT]
    else:
        what = redact_text(f"{type(exc).__name__}: {exc}")[:MAX_TEXT]
    tail = _log_tail_of(settings, ticket)
    message = HostMessage(
        Kind.ERROR, ticket.run_id, ticket.lease_owner, what, result={"log_tail": tail}
    )
    try:
        send(conn, settings.host, message)
    except Exception as failed:  # Redis gone for good, or refusing the message
        why = redis_problem(failed) if isinstance(failed, RedisError) else repr(failed)
        log.error("run=%s the bot could not be told of the error: %s", ticket.run_id, why)
        return False
    return True


def _log_tail_of(settings: Settings, ticket: Ticket) -> str:
    """The end of the run's output log, if the run got a directory (the newest of its id)."""
    found = sorted(
        Path(settings.work_dir).glob(f"run-{ticket.run_id}-*/output.log"),
        key=lambda path: path.stat().st_mtime,
    )
    if not found:
        return ""
    with found[-1].open("rb") as logged:
        logged.seek(max(0, found[-1].stat().st_size - ERROR_LOG_TAIL_BYTES))
        return logged.read().decode("utf-8", "replace")


def _forget(conn: Redis, host: str, ticket: Ticket) -> None:
    pipe = conn.pipeline()
    pipe.lrem(keys.host_taken(host), 1, ticket.to_json())
    pipe.lrem(keys.host_taken(host), 1, ticket.without_token().to_json())
    pipe.srem(keys.host_cancel(host), ticket.run_id)
    pipe.execute()


def _execute(conn: Redis, settings: Settings, backend: GpuBackend | None, ticket: Ticket) -> str:
    tag = f"run={ticket.run_id}"
    try:
        config, batch = _config_of(ticket)
        parts = _request_parts(settings, ticket, config.runtime_for(batch))
        through_outage(f"{tag} start checks", lambda: _may_start(conn, settings, backend, ticket))
        _recheck_with_github(ticket)
    except RunRefused as exc:
        message = HostMessage(
            Kind.NOT_STARTED, ticket.run_id, ticket.lease_owner, str(exc)[:2000], exc.retry
        )
        send(conn, settings.host, message)
        log.info("%s repo=%s sha=%s not started: %s", tag, ticket.repo, ticket.sha, exc)
        return f"run {ticket.run_id} not started: {exc}"
    with leases.LeaseHeartbeat(
        conn, settings.host, ticket.gpu_indices, ticket.lease_owner, settings.lease_ttl_s
    ) as heartbeat:
        send(conn, settings.host, HostMessage(Kind.STARTED, ticket.run_id, ticket.lease_owner))
        result = _run(conn, settings, backend, ticket, heartbeat.lost, (config, batch), parts)
        _wait_until_free(backend, ticket.gpu_indices, settings.kill_grace_s)
    if SHUTDOWN.is_set():  # the worker is stopping: the batch did not end by itself
        reason = f"the worker on {settings.host} was stopped while the batch ran"
        message = HostMessage(Kind.NOT_STARTED, ticket.run_id, ticket.lease_owner, reason, True)
        send(conn, settings.host, message)
        return f"run {ticket.run_id}: stopped with the worker"
    if heartbeat.lost.is_set():  # the batch was stopped: its GPUs were no longer ours
        result.report.stopped = heartbeat.reason
        send(
            conn,
            settings.host,
            HostMessage(Kind.LEASE_LOST, ticket.run_id, ticket.lease_owner, "heartbeat"),
        )
    _finish(conn, settings, ticket, result)
    try:  # the bot has the result: nothing that fails here may end the run again
        _clean_up(settings, result)
    except OSError as exc:
        log.warning("run=%s its directory was not cleaned up: %s", ticket.run_id, exc)
    return f"run {ticket.run_id}: {result.conclusion.value} - {result.title}"


def _config_of(ticket: Ticket) -> tuple[Config, Batch]:
    """The ticket's config and batch (the bot validated both); RunRefused if they are not."""
    try:
        config = load_config(ticket.config_text, ".gpuci.yml")
        return config, config.batches[ticket.batch]
    except ConfigError as exc:
        why = f"refused: the ticket's config is not valid: {exc}"
    except KeyError:
        why = f"refused: the config has no batch {ticket.batch!r}"
    raise RunRefused(why, retry=False)


def _request_parts(settings: Settings, ticket: Ticket, runtime: Runtime) -> dict[str, Any]:
    """The run's environment, sandbox and caches on this host; RunRefused (back to pending,
    for another host) when this one does not provide its runtime."""
    try:
        setup = HostSetup.from_settings(settings, probe=False)
        return setup.request_parts(runtime, ticket.repo, trusted=ticket.trust == "trusted")
    except (HostSetupError, RuntimeUnavailable) as exc:
        raise RunRefused(f"{settings.host}: {exc}", retry=True) from None


def _may_start(conn: Redis, settings: Settings, backend: GpuBackend | None, ticket: Ticket) -> None:
    """The worker's own checks at start: the ticket is fresh and not cancelled, the SHA is a
    SHA, the lease is still ours, the disk has room, the GPUs are idle under the lease."""
    if ticket.deadline and time.time() > ticket.deadline:
        raise RunRefused("the ticket expired before the host took it", retry=True)
    if conn.sismember(keys.host_cancel(settings.host), ticket.run_id):
        raise RunRefused("cancelled before it started", retry=False)
    if not is_sha(ticket.sha):
        raise RunRefused(f"refused: {ticket.sha!r} is not a 40-hex commit SHA", retry=False)
    held = leases.holders(conn, settings.host, ticket.gpu_indices)
    if any(owner != ticket.lease_owner for owner in held.values()):
        raise RunRefused(
            f"the lease on GPUs {list(ticket.gpu_indices)} was lost before start", retry=True
        )
    full = disk_problem(Path(settings.work_dir), settings.bytes_of("min_free_disk"))
    if full:
        raise RunRefused(f"{settings.host} takes no runs: {full}", retry=True)
    if backend is not None:
        busy = [s for s in _states(settings, backend) if s.gpu.index in ticket.gpu_indices]
        taken = [f"GPU {s.gpu.index}: {'; '.join(s.reasons)}" for s in busy if not s.idle]
        if taken:
            raise RunRefused("GPUs got busy before start (" + ", ".join(taken) + ")", retry=True)


def _recheck_with_github(ticket: Ticket) -> None:
    """Before approved fork code runs: GitHub itself says the PR is open, its head is still
    the approved SHA, and the approver still has write access."""
    if ticket.trust != "approved":
        return
    base = f"{ticket.api_url.rstrip('/')}/repos/{ticket.repo}"
    headers = {
        "Authorization": f"token {ticket.source_token}",
        "Accept": "application/vnd.github+json",
    }
    try:
        pull = requests.get(f"{base}/pulls/{ticket.pr}", headers=headers, timeout=30)
        role = requests.get(
            f"{base}/collaborators/{ticket.approver}/permission", headers=headers, timeout=30
        )
    except requests.RequestException as exc:
        raise RunRefused(f"cannot re-check the PR with GitHub: {exc}", retry=True) from None
    if pull.status_code != 200 or role.status_code != 200:
        raise RunRefused(
            f"cannot re-check the PR with GitHub (HTTP {pull.status_code}, {role.status_code})",
            retry=True,
        )
    try:
        refusal = github_refusal(ticket, pull.json(), role.json())
    except ValueError:
        why = "cannot re-check the PR with GitHub: its answer is not JSON"
        raise RunRefused(why, retry=True) from None
    if refusal:
        raise RunRefused(refusal, retry=False)


def github_refusal(ticket: Ticket, pull: Any, permission: Any) -> str | None:
    """Why GitHub's answers forbid starting the approved ticket (the PR closed, its fork
    deleted, its head moved, the approver lost write access, an answer of the wrong shape);
    None when they allow it."""
    if not isinstance(pull, dict) or not isinstance(permission, dict):
        return "refused: GitHub's answer about the PR is not an object"
    found = pull.get("head")
    side: dict[str, Any] = found if isinstance(found, dict) else {}
    head = side.get("sha")
    if pull.get("state") != "open":
        return f"refused: the PR is {pull.get('state')!s}, not open"
    if "repo" in side and side["repo"] is None:
        return "refused: the PR's head repository was deleted (a deleted fork)"
    if head != ticket.sha:
        return f"refused: the PR's head is now {str(head)[:10]}, not the approved {ticket.sha[:10]}"
    if not role_from_api(permission.get("role_name"), permission.get("permission")).can_write:
        return (
            f"refused: {ticket.approver}, who approved {ticket.sha[:10]}, no longer has write "
            "access"
        )
    return None


def _states(settings: Settings, backend: GpuBackend) -> list[GpuState]:
    return gpu_states(
        backend,
        {},
        samples=settings.idle_samples,
        interval_s=settings.idle_sample_interval_s,
        idle_memory_mb=settings.idle_memory_mb,
    )


def _run(
    conn: Redis,
    settings: Settings,
    backend: GpuBackend | None,
    ticket: Ticket,
    lease_lost: threading.Event,
    configured: tuple[Config, Batch],
    parts: dict[str, Any],
) -> BatchResult:
    config, batch = configured
    gpus = [g for g in backend.snapshot() if g.index in ticket.gpu_indices] if backend else []
    cancel = threading.Event()
    watcher = threading.Thread(
        target=_watch_cancel, args=(conn, settings.host, ticket.run_id, cancel, lease_lost),
        daemon=True,
    )  # fmt: skip
    watcher.start()
    try:
        archive = fetch_archive(
            ticket.api_url, ticket.repo, ticket.sha, ticket.source_token, _cache_dir(settings)
        )
        _drop_token(conn, settings.host, ticket)
        trim_archives(_cache_dir(settings), settings.bytes_of("archive_cache_max_size"))
        request = run_request(
            settings, config, batch, source=archive, run_id=f"run-{ticket.run_id}",
            gpu_indices=ticket.gpu_indices, gpus=gpus,
            simulated=backend.simulated if backend else True, parts=parts,
        )  # fmt: skip
        outcome = run_batch(request, cancel=cancel, gpu_pids=lambda: _pids_on(backend, ticket))
    except (SourceError, RunnerError) as exc:
        outcome = _failed_outcome(settings, str(exc))
    finally:
        cancel.set()  # also stops the watcher
    faults.inject(settings.test_fault, "results")
    return conclude_run(settings, batch, ticket.sha, gpus, outcome)


def _drop_token(conn: Redis, host: str, ticket: Ticket) -> None:
    """The archive is here: the ticket kept for a restart no longer holds the token."""

    def swap() -> None:
        pipe = conn.pipeline()
        pipe.lrem(keys.host_taken(host), 1, ticket.to_json())
        pipe.lpush(keys.host_taken(host), ticket.without_token().to_json())
        pipe.execute()

    through_outage(f"run={ticket.run_id} drop the source token", swap)


def _watch_cancel(
    conn: Redis, host: str, run_id: str, cancel: threading.Event, lease_lost: threading.Event
) -> None:
    """A cancellation by the bot (supersede, close, /gpuci cancel) or the loss of the run's GPU
    leases stops the batch."""
    while not cancel.wait(1.0):
        if SHUTDOWN.is_set():
            log.warning("run=%s the worker is stopping; stopping the batch", run_id)
            cancel.set()
            return
        if lease_lost.is_set():
            log.warning("run=%s GPU lease lost; stopping the batch", run_id)
            cancel.set()
            return
        try:
            cancelled = conn.sismember(keys.host_cancel(host), run_id)
        except Exception as exc:  # Redis restarting: keep running, look again
            log.warning("run=%s cannot read its cancellation: %s", run_id, exc)
            continue
        if cancelled:
            log.info("run=%s cancelled by the bot", run_id)
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


def _finish(conn: Redis, settings: Settings, ticket: Ticket, result: BatchResult) -> None:
    """Upload the JUnit XML, then tell the bot the run's report; each step waits out a Redis
    restart. The bot judges the report itself, with its own config."""
    tag = f"run={ticket.run_id}"
    faults.inject(settings.test_fault, "store")
    junit = result.outcome.junit_path
    if junit is not None and junit.is_file():
        packed = gzip.compress(junit.read_bytes())
        if len(packed) <= JUNIT_MAX_BYTES:
            key = keys.host_junit(settings.host, ticket.run_id)
            through_outage(f"{tag} upload JUnit", lambda: conn.set(key, packed, ex=24 * 3600))
    message = HostMessage(
        Kind.FINISHED, ticket.run_id, ticket.lease_owner, result=result.report.to_json()
    )
    send(conn, settings.host, message)
    log.info(
        "%s repo=%s sha=%s batch=%s finished: %s - %s",
        tag, ticket.repo, ticket.sha, ticket.batch, result.conclusion.value, result.title,
    )  # fmt: skip


def _clean_up(settings: Settings, result: BatchResult) -> None:
    """The report is sent: the run's directory goes (a failed run's is kept a while)."""
    workdir = result.outcome.workdir
    if workdir == Path(settings.work_dir) or not workdir.is_dir():
        return  # the run never got a directory of its own
    failed = result.conclusion.value not in ("success", "neutral")
    keep = settings.seconds_of("keep_failed_runs")
    finish_workdir(workdir, failed=failed, keep_failed_s=keep, now=time.time())


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


if __name__ == "__main__":
    sys.exit(main())
