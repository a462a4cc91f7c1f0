"""The bot's end of the GPU host protocol (contract/hostlink.py): tickets onto a host's list,
cancellations onto its set, and each host's messages read, checked and applied. A message is
applied only if the run is assigned to the host that sent it under the same lease, the state
change is one the run may make, and its report is well-formed; the bot then judges the report
with its own config, so nothing a host writes decides a run's repository, installation, Check
Run, trust or conclusion rules."""

from __future__ import annotations

import gzip
import io
import json
import logging
import threading
import time
from typing import Any

from redis import Redis

from bot import history, runs
from bot.reporting import report
from bot.runs import Run, RunState
from contract import keys, leases
from contract.checks import Verdict, fenced, judge
from contract.config import ConfigError, load_config
from contract.hostlink import HOST_NAME, HostMessage, Kind, ProtocolError, Ticket
from contract.leases import UNREACHABLE
from contract.redis_errors import redis_problem
from contract.results import ResultError, RunReport
from contract.settings import Settings

log = logging.getLogger("gpuci.hostlink")

REQUEUE_LIMIT = 1  # a run whose worker was lost is re-queued this many times, then failed
REJECTED_KEPT = 100
JUNIT_MAX_BYTES = 8 * 1024 * 1024
PUMP_IDLE_S = 0.2
LIVE = {RunState.ASSIGNED, RunState.RUNNING}


def dispatch(conn: Redis, host: str, ticket: Ticket) -> None:
    """Give the host a ticket (its list is the only place the source token is)."""
    conn.lpush(keys.host_tickets(host), ticket.to_json())


def cancel(conn: Redis, run: Run) -> None:
    """Tell the run's host, if it has one, to stop it."""
    if run.host:
        conn.sadd(keys.host_cancel(run.host), run.run_id)


def known_hosts(conn: Redis) -> list[str]:
    """Hosts that registered, with a name a host may have (others are ignored)."""
    names = (n.decode() if isinstance(n, bytes) else str(n) for n in conn.smembers(keys.hosts()))
    return sorted(n for n in names if HOST_NAME.fullmatch(n))


def drain(conn: Redis, hosts: list[str] | None = None, limit: int = 1000) -> int:
    """Apply the hosts' waiting messages, oldest first; how many were read. Each is moved to a
    list of the bot's while it is applied, so a Redis outage or a dying process mid-way leaves
    it there to be applied again rather than lost; a message that breaks the code applying it
    is set aside as rejected."""
    done = 0
    for host in known_hosts(conn) if hosts is None else hosts:
        applying = keys.host_messages_applying(host)
        while done < limit:
            raw = conn.lindex(applying, -1) or conn.lmove(
                keys.host_outbox(host), applying, "RIGHT", "LEFT"
            )
            if not isinstance(raw, bytes | str):
                break
            try:
                handle(conn, host, raw)
            except UNREACHABLE:
                raise
            except Exception as exc:
                log.exception("host=%s a message broke its handling; set aside", host)
                _set_aside(conn, host, raw, f"rejected: handling failed ({exc!r})"[:500])
            conn.lrem(applying, 1, raw)  # type: ignore[arg-type]
            done += 1
    return done


def handle(conn: Redis, host: str, raw: bytes | str) -> str:
    """Check and apply one message from `host`; what was done (or why nothing was)."""
    try:
        message = HostMessage.from_json(raw)
        outcome = _APPLY[message.kind](conn, host, message)
    except (ProtocolError, ResultError) as exc:
        outcome = f"rejected: {exc}"
    if outcome.startswith("rejected"):
        _set_aside(conn, host, raw, outcome)
    conn.hincrby(keys.host_messages_seen(), f"{host}:{outcome.split(':', 1)[0]}", 1)
    return outcome


def _set_aside(conn: Redis, host: str, raw: bytes | str, why: str) -> None:
    log.warning("host=%s message rejected: %s", host, why)
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    entry = json.dumps({"host": host, "why": why, "message": text[:4000], "at": time.time()})
    pipe = conn.pipeline()
    pipe.lpush(keys.host_messages_rejected(), entry)
    pipe.ltrim(keys.host_messages_rejected(), 0, REJECTED_KEPT - 1)
    pipe.execute()


def _run_of(conn: Redis, host: str, message: HostMessage, states: set[RunState]) -> Run:
    """The run the message is about, if `host` holds it under the message's lease."""
    run = runs.get_run(conn, message.run_id)
    if run is None:
        raise ProtocolError(f"run {message.run_id} does not exist")
    if run.host != host or run.lease_owner != message.lease_owner:
        raise ProtocolError(f"run {run.run_id} is not assigned to {host} under that lease")
    if run.state not in states:
        raise ProtocolError(f"run {run.run_id} is {run.state}, not {'/'.join(sorted(states))}")
    return run


def _hello(conn: Redis, host: str, message: HostMessage) -> str:
    conn.sadd(keys.hosts(), host)
    lost = recover_host_runs(conn, host)
    return f"hello: {len(lost)} runs recovered"


def _unless_cancelled(
    conn: Redis, host: str, message: HostMessage, states: set[RunState]
) -> Run | None:
    """The message's run (as `_run_of`), or None when the bot cancelled it meanwhile."""
    try:
        return _run_of(conn, host, message, states)
    except ProtocolError:
        if _cancelled(conn, message):
            return None
        raise


def _started(conn: Redis, host: str, message: HostMessage) -> str:
    run = _unless_cancelled(conn, host, message, {RunState.ASSIGNED})
    if run is None:
        return "ignored: cancelled"
    moved = runs.transition(
        conn, run.run_id, {RunState.ASSIGNED}, state=RunState.RUNNING,
        started_at=time.time(), wait_reason="",
    )  # fmt: skip
    if moved is not None:
        report(conn, run.run_id)
    return "started"


def _not_started(conn: Redis, host: str, message: HostMessage) -> str:
    run = _unless_cancelled(conn, host, message, LIVE)
    if run is None:
        return "ignored: cancelled"
    leases.release(conn, host, run.gpus, run.lease_owner)
    reason = message.reason or "not started"
    if run.state is RunState.RUNNING:  # it was running when its worker went away
        recover_lost_run(conn, run, reason)
    elif message.retry:
        runs.transition(
            conn, run.run_id, {RunState.ASSIGNED}, state=RunState.PENDING, wait_reason=reason,
            note=reason, host="", gpus=(), lease_owner="",
        )  # fmt: skip
    else:
        runs.finish_run(conn, run, conclusion="failure", title=reason)
    report(conn, run.run_id)
    return "not started"


def _finished(conn: Redis, host: str, message: HostMessage) -> str:
    try:
        run = _run_of(conn, host, message, LIVE)
    except ProtocolError:
        cancelled = runs.get_run(conn, message.run_id)
        if cancelled is None or not _cancelled(conn, message) or cancelled.host != host:
            raise
        run = cancelled  # its result is still kept, and the run stays cancelled
    result = RunReport.from_json(message.result)
    try:
        config = load_config(run.config_text, ".gpuci.yml")
        allow_no_tests = config.batches[run.batch].allow_no_tests
    except (ConfigError, KeyError):
        allow_no_tests = False
    verdict = judge(result, batch=run.batch, allow_no_tests=allow_no_tests, sha=run.sha, host=host)
    verdict = _against_history(conn, run, result, verdict)
    store_result(conn, run.run_id, verdict.data, verdict.output.__dict__, result.log_tail)
    _take_junit(conn, host, run.run_id)
    leases.release(conn, host, run.gpus, run.lease_owner)  # before the run reads as finished
    current = runs.get_run(conn, run.run_id) or run
    runs.finish_run(conn, current, conclusion=verdict.conclusion.value, title=verdict.title)
    if result.duration_s and not (result.cancelled or result.timed_out):
        runs.record_duration(conn, run.repo, run.batch, result.duration_s)
    report(conn, run.run_id)
    log.info(
        "run=%s repo=%s sha=%s batch=%s host=%s finished: %s - %s",
        run.run_id, run.repo, run.sha, run.batch, host, verdict.conclusion.value, verdict.title,
    )  # fmt: skip
    return "finished"


def _error(conn: Redis, host: str, message: HostMessage) -> str:
    """gpuci's own code raised on the host while it held the run: the run fails, its Check Run
    naming the host (as the bot knows it) and the exception, with the log so far."""
    run = _unless_cancelled(conn, host, message, LIVE)
    if run is None:
        return "ignored: cancelled"
    leases.release(conn, host, run.gpus, run.lease_owner)
    title = f"gpuci error on {host}: {message.reason or 'unknown error'}"[:1000]
    tail = str(message.result.get("log_tail", ""))
    data = {"batch": run.batch, "sha": run.sha, "conclusion": "failure", "title": title}
    store_result(conn, run.run_id, data, _error_output(run, host, title, tail), tail)
    runs.finish_run(conn, run, conclusion="failure", title=title)
    report(conn, run.run_id)
    log.error("run=%s repo=%s sha=%s batch=%s %s", run.run_id, run.repo, run.sha, run.batch, title)
    return "error"


def _error_output(run: Run, host: str, title: str, tail: str) -> dict[str, Any]:
    """The Check Run of a run that gpuci itself broke: not a test result, and where to look."""
    summary = (
        f"gpuci itself failed on `{host}` while it ran batch `{run.batch}` at `{run.sha[:12]}`; "
        "this is not a test result. The run was stopped and its GPUs released; the traceback "
        f"is in the worker's log on {host} (`journalctl -u gpuci-worker`)."
    )
    text = f"## Log tail\n\n{fenced(tail, 'text')}" if tail.strip() else ""
    return {"title": title, "summary": summary, "text": text, "annotations": []}


def _against_history(conn: Redis, run: Run, result: RunReport, verdict: Verdict) -> Verdict:
    """The verdict with each failure's class against the default branch, the run recorded.
    The history only adds to a verdict: if it breaks, the run is reported as judged."""
    policy, bounds = history.from_settings(Settings.from_env())
    try:
        mode = load_config(run.config_text, ".gpuci.yml").conclusion
    except ConfigError:
        mode = "strict"
    try:
        return history.judge_with_history(
            conn, run, result, verdict, mode=mode, policy=policy, bounds=bounds
        )
    except UNREACHABLE:
        raise  # the message is applied again once Redis is back
    except Exception:
        log.exception("run=%s the test history failed; reported without it", run.run_id)
        return verdict


def _lease_lost(conn: Redis, host: str, message: HostMessage) -> str:
    _run_of(conn, host, message, LIVE | {RunState.CANCELLED, RunState.COMPLETED})
    count_lost_lease(conn, "heartbeat")
    return "lease lost"


def _cancelled(conn: Redis, message: HostMessage) -> bool:
    run = runs.get_run(conn, message.run_id)
    return run is not None and run.state is RunState.CANCELLED


_APPLY = {
    Kind.HELLO: _hello,
    Kind.STARTED: _started,
    Kind.NOT_STARTED: _not_started,
    Kind.FINISHED: _finished,
    Kind.LEASE_LOST: _lease_lost,
    Kind.ERROR: _error,
}


def _take_junit(conn: Redis, host: str, run_id: str) -> None:
    """The host's upload, kept only if it is gzip within the cap."""
    key = keys.host_junit(host, run_id)
    packed = conn.get(key)
    conn.delete(key)
    if not isinstance(packed, bytes) or len(packed) > JUNIT_MAX_BYTES:
        return
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(packed)) as probe:
            probe.read(1)
    except (OSError, EOFError):
        log.warning("run=%s JUnit upload from %s is not gzip; dropped", run_id, host)
        return
    conn.set(keys.junit(run_id), packed, ex=runs.RESULT_TTL_S)


def store_result(
    conn: Redis, run_id: str, data: dict[str, Any], output: dict[str, Any], log_tail: str
) -> None:
    runs.store_result(conn, run_id, {**data, "check_output": output, "log_tail": log_tail})


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
            conn, run.run_id, {RunState.ASSIGNED, RunState.RUNNING}, state=RunState.PENDING,
            attempts=run.attempts + 1, host="", gpus=(), lease_owner="",
            wait_reason=f"re-queued: {reason}", note=f"re-queued: {reason}",
        )  # fmt: skip
        outcome = "requeued" if moved else "gone"
    else:
        runs.finish_run(conn, run, conclusion="failure", title=reason)
    report(conn, run.run_id)
    log.warning("run=%s repo=%s sha=%s %s: %s", run.run_id, run.repo, run.sha, outcome, reason)
    return outcome


def recover_host_runs(conn: Redis, host: str) -> list[str]:
    """A host (re)started: runs it was running are lost (their processes died with it). Runs
    only assigned are still in its tickets, or reported lost by the host itself."""
    lost = [r for r in runs.dispatched_runs(conn) if r.host == host and r.state is RunState.RUNNING]
    return [r.run_id for r in lost if recover_lost_run(conn, r, f"worker restarted on {host}")]


class HostLinkPump(threading.Thread):
    """In the events process: applies the hosts' messages as they arrive, riding out a Redis
    restart (its own client: sharing one with RQ's worker breaks RQ's reconnects)."""

    def __init__(self, conn: Redis):
        super().__init__(name="gpuci-hostlink", daemon=True)
        self.conn = conn
        self.stopped = threading.Event()
        self.applying = threading.Lock()  # held while a round of messages is applied

    def run(self) -> None:
        warned = False
        while not self.stopped.is_set():
            try:
                with self.applying:
                    busy = drain(self.conn)
                warned = False
            except UNREACHABLE as exc:
                if not warned:
                    log.warning("host messages: Redis %s; retrying", redis_problem(exc))
                    warned = True
                busy = 0
                self.stopped.wait(1.0)
            except Exception:
                log.exception("host messages: a message failed; going on")
                busy = 0
            if not busy:
                self.stopped.wait(PUMP_IDLE_S)

    def settle(self) -> None:
        """Return once no message this pump took is still being applied."""
        with self.applying:
            pass

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=5)
