"""`GET /metrics`: gpuci's state in Prometheus' text format, read from Redis on each scrape."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from flask import Blueprint, Response, current_app
from redis import Redis
from redis.exceptions import RedisError
from rq import Queue

from bot import dashboard
from bot.inbox import EVENTS_QUEUE, pending
from bot.reporting import REPORTS_QUEUE
from bot.runs import RunState
from contract import keys

blueprint = Blueprint("metrics", __name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RUN_WINDOW = 1000  # runs by state and durations are counted over the newest this many runs
QUANTILES = (0.5, 0.9, 0.99)

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric: its name, kind, help line, and (labels, value) samples."""

    name: str
    kind: str  # counter | gauge | summary
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)

    def add(self, value: float, suffix: str = "", **labels: str) -> Family:
        self.samples.append((suffix, tuple(labels.items()), value))
        return self


# --- the text format (pure) --------------------------------------------------------------------


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: Iterable[Family]) -> str:
    """Prometheus exposition format 0.0.4: HELP and TYPE, then one line per sample."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for suffix, labels, value in family.samples:
            text = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels)
            braces = f"{{{text}}}" if text else ""
            lines.append(f"{family.name}{suffix}{braces} {_number(value)}")
    return "\n".join(lines) + "\n"


def quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of sorted values."""
    rank = max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def duration_summary(durations: Sequence[float]) -> Family:
    family = Family(
        "gpuci_run_duration_seconds",
        "summary",
        f"Run time (start to finish) of the completed runs among the newest {RUN_WINDOW} runs; "
        "a window, not a cumulative count: read the quantiles, do not rate() _count.",
    )
    ordered = sorted(durations)
    for q in QUANTILES if ordered else ():
        family.add(quantile(ordered, q), quantile=str(q))
    family.add(sum(ordered), "_sum").add(len(ordered), "_count")
    return family


# --- reading Redis -----------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def webhook_counts(conn: Redis) -> Family:
    family = Family(
        "gpuci_webhooks_total",
        "counter",
        "Webhook deliveries answered, by event and outcome "
        "(queued, duplicate, replayed, ignored, ping, rejected, unavailable).",
    )
    for raw_field, raw_count in sorted(conn.hgetall(keys.webhook_counts()).items()):
        event, _, outcome = _text(raw_field).rpartition(":")
        family.add(int(raw_count), event=event, outcome=outcome)
    return family


def queue_depths(conn: Redis, hosts: Sequence[dashboard.HostView]) -> Family:
    family = Family("gpuci_queue_jobs", "gauge", "Jobs waiting in each queue.")
    for name in (EVENTS_QUEUE, REPORTS_QUEUE):
        family.add(Queue(name, connection=conn).count, queue=name)
    for host in hosts:  # tickets a host has not taken yet, and messages the bot has not read
        family.add(conn.llen(keys.host_tickets(host.name)), queue=f"host-tickets:{host.name}")
        family.add(conn.llen(keys.host_outbox(host.name)), queue=f"host-outbox:{host.name}")
    family.add(pending(conn), queue="webhook-inbox")  # accepted deliveries not yet jobs
    family.add(conn.zcard(keys.pending_runs()), queue="pending-runs")
    return family


def run_families(conn: Redis) -> list[Family]:
    """Runs by state, and the durations of the completed ones, over the newest RUN_WINDOW."""
    ids: list[bytes] = conn.zrevrange(keys.all_runs(), 0, RUN_WINDOW - 1)  # type: ignore[assignment]
    pipe = conn.pipeline()
    for run_id in ids:
        pipe.hmget(keys.run(_text(run_id)), ["state", "started_at", "finished_at"])
    states: Counter[str] = Counter()
    durations = []
    for state, started, finished in pipe.execute():
        if state is None:
            continue
        states[_text(state)] += 1
        begin, end = float(started or 0), float(finished or 0)
        if _text(state) == RunState.COMPLETED and begin and end >= begin:
            durations.append(end - begin)
    by_state = Family("gpuci_runs", "gauge", f"Runs by state among the newest {RUN_WINDOW} runs.")
    for state in RunState:
        by_state.add(states[state.value], state=state.value)
    return [by_state, duration_summary(durations)]


def host_families(hosts: Sequence[dashboard.HostView]) -> list[Family]:
    gpus = Family("gpuci_gpus", "gauge", "GPUs by host and status (idle, leased, busy, unhealthy).")
    up = Family("gpuci_host_up", "gauge", "1 while the host's heartbeat is fresh.")
    age = Family("gpuci_host_heartbeat_age_seconds", "gauge", "Seconds since the host's heartbeat.")
    for host in hosts:
        for status in dashboard.GpuStatus:
            gpus.add(host.count(status), host=host.name, status=status.value)
        up.add(int(host.alive), host=host.name)
        if host.heartbeat_age_s is not None:
            age.add(round(host.heartbeat_age_s, 3), host=host.name)
    return [gpus, up, age]


def github_families(conn: Redis) -> list[Family]:
    """REST calls the events worker made, by method and status; the rate-limit budget left."""
    calls = Family(
        "gpuci_github_calls_total", "counter", "GitHub REST calls by method and HTTP status."
    )
    remaining = Family(
        "gpuci_github_rate_limit_remaining", "gauge", "Requests left in GitHub's rate-limit window."
    )
    for raw_field, raw_count in sorted(conn.hgetall(keys.github_calls()).items()):
        name = _text(raw_field)
        if name == "remaining":
            remaining.add(int(raw_count))
            continue
        method, _, status = name.partition(":")
        calls.add(int(raw_count), method=method, status=status)
    return [calls, remaining]


def leases_lost_family(conn: Redis) -> Family:
    family = Family(
        "gpuci_leases_lost_total",
        "counter",
        "GPU leases lost (heartbeat: under a running batch; before_start; host_lost).",
    )
    for raw_field, raw_count in sorted(conn.hgetall(keys.leases_lost()).items()):
        family.add(int(raw_count), cause=_text(raw_field))
    return family


def scheduler_family(conn: Redis, now: float) -> Family:
    alive, _ = dashboard.scheduler_heartbeat(conn, now)
    return Family("gpuci_scheduler_up", "gauge", "1 while the scheduler heartbeats.").add(
        int(alive)
    )


def collect(conn: Redis, now: float) -> list[Family]:
    hosts = dashboard.read_hosts(conn, now)
    return [
        webhook_counts(conn),
        queue_depths(conn, hosts),
        *run_families(conn),
        *host_families(hosts),
        scheduler_family(conn, now),
        *github_families(conn),
        leases_lost_family(conn),
    ]


@blueprint.get("/metrics")
def metrics() -> Response:
    """Open like /healthz: counts and host names only, no repository, test or log text."""
    conn: Redis = current_app.extensions["gpuci_redis"]
    try:
        body = render(collect(conn, time.time()))
    except RedisError as exc:
        return Response(f"# redis unreachable: {exc}\n", 503, content_type=CONTENT_TYPE)
    return Response(body, content_type=CONTENT_TYPE)
