"""/metrics and /healthz against real Redis: the numbers an operator's dashboards read."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis import Redis
from rq import Queue

from app import create_app
from bot import runs
from bot.metrics import Family, quantile, render
from bot.runs import RunState
from bot.webhooks import signature_of
from contract import keys, leases
from contract.settings import Settings
from tests.test_dashboard import new_run, publish, shared_gpus

SECRET = "metrics-secret"


@pytest.fixture
def client(redis_conn: Redis, redis_url: str) -> Any:
    settings = Settings(redis_url=redis_url, webhook_secret=SECRET)
    return create_app(settings, redis_conn).test_client()


def scrape(client: Any) -> dict[str, float]:
    """Each sample line of /metrics: `name{labels}` -> value; TYPE lines checked on the way."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for line in response.get_data(as_text=True).splitlines():
        if line.startswith("# TYPE"):
            assert line.split()[3] in ("counter", "gauge", "summary")
        elif line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def deliver(client: Any, event: str, delivery: str, secret: str = SECRET) -> int:
    body = json.dumps({"action": "opened", "zen": "hi", "hook_event": event}).encode()
    headers = {
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": signature_of(secret, body),
        "Content-Type": "application/json",
    }
    status: int = client.post("/webhook", data=body, headers=headers).status_code
    return status


def test_webhooks_by_event_and_outcome(client: Any) -> None:
    first = str(uuid.uuid4())
    assert deliver(client, "pull_request", first) == 202
    assert deliver(client, "pull_request", first) == 202
    assert deliver(client, "pull_request", str(uuid.uuid4())) == 202  # its body, a new id
    assert deliver(client, "issue_comment", str(uuid.uuid4())) == 202
    assert deliver(client, "star", str(uuid.uuid4())) == 202
    assert deliver(client, "ping", str(uuid.uuid4())) == 200
    assert deliver(client, "<evil>", str(uuid.uuid4()), secret="wrong") == 401
    found = scrape(client)
    assert found['gpuci_webhooks_total{event="pull_request",outcome="queued"}'] == 1
    assert found['gpuci_webhooks_total{event="pull_request",outcome="duplicate"}'] == 1
    assert found['gpuci_webhooks_total{event="pull_request",outcome="replayed"}'] == 1
    assert found['gpuci_webhooks_total{event="issue_comment",outcome="queued"}'] == 1
    assert found['gpuci_webhooks_total{event="star",outcome="ignored"}'] == 1
    assert found['gpuci_webhooks_total{event="ping",outcome="ping"}'] == 1
    assert found['gpuci_webhooks_total{event="-",outcome="rejected"}'] == 1
    assert not any("evil" in name for name in found)
    assert found['gpuci_queue_jobs{queue="webhook-inbox"}'] == 2  # accepted, not yet jobs
    assert found['gpuci_queue_jobs{queue="gpuci-events"}'] == 0


def test_queue_depths(client: Any, redis_conn: Redis) -> None:
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    redis_conn.lpush(keys.host_tickets("h20-01"), "{}")
    redis_conn.lpush(keys.host_outbox("h20-01"), "{}", "{}")
    Queue("gpuci-reports", connection=redis_conn).enqueue("builtins.print", "y")
    new_run(redis_conn), new_run(redis_conn, pr=8)
    found = scrape(client)
    assert found['gpuci_queue_jobs{queue="gpuci-events"}'] == 0
    assert found['gpuci_queue_jobs{queue="webhook-inbox"}'] == 0
    assert found['gpuci_queue_jobs{queue="gpuci-reports"}'] == 1
    assert found['gpuci_queue_jobs{queue="host-tickets:h20-01"}'] == 1
    assert found['gpuci_queue_jobs{queue="host-outbox:h20-01"}'] == 2
    assert found['gpuci_queue_jobs{queue="pending-runs"}'] == 2


def test_runs_by_state_and_durations(client: Any, redis_conn: Redis) -> None:
    new_run(redis_conn)
    new_run(redis_conn, state=RunState.RUNNING)
    new_run(redis_conn, state=RunState.AWAITING_APPROVAL)
    for seconds in (10, 20, 30, 40):
        run = new_run(redis_conn, state=RunState.RUNNING, started_at=1000.0)
        runs.update_run(redis_conn, run, state=RunState.COMPLETED, finished_at=1000.0 + seconds)
    new_run(redis_conn, state=RunState.CANCELLED)  # never started: no duration
    found = scrape(client)
    states = {s.value: found[f'gpuci_runs{{state="{s.value}"}}'] for s in RunState}
    assert states == {
        "awaiting_approval": 1,
        "pending": 1,
        "assigned": 0,
        "running": 1,
        "completed": 4,
        "cancelled": 1,
    }
    assert found["gpuci_run_duration_seconds_count"] == 4
    assert found["gpuci_run_duration_seconds_sum"] == 100
    assert found['gpuci_run_duration_seconds{quantile="0.5"}'] == 20
    assert found['gpuci_run_duration_seconds{quantile="0.99"}'] == 40


def test_gpus_by_host_and_status(client: Any, redis_conn: Redis, tmp_path: Path) -> None:
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    leases.acquire(redis_conn, "h20-01", [0, 1, 2], leases.new_owner("5"), 30)
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": shared_gpus()}))
    publish(redis_conn, "shared-01", f"sim:{gpus}")
    publish(redis_conn, "gone-01", "sim:1xT4-16GB")
    redis_conn.delete(keys.host_alive("gone-01"))
    found = scrape(client)

    def gpus_of(host: str) -> dict[str, float]:
        return {
            status: found[f'gpuci_gpus{{host="{host}",status="{status}"}}']
            for status in ("idle", "leased", "busy", "unhealthy")
        }

    assert gpus_of("h20-01") == {"idle": 5, "leased": 3, "busy": 0, "unhealthy": 0}
    assert gpus_of("shared-01") == {"idle": 0, "leased": 0, "busy": 1, "unhealthy": 1}
    assert gpus_of("gone-01") == {"idle": 0, "leased": 0, "busy": 0, "unhealthy": 1}
    assert found['gpuci_host_up{host="h20-01"}'] == 1
    assert found['gpuci_host_up{host="gone-01"}'] == 0
    assert 0 <= found['gpuci_host_heartbeat_age_seconds{host="gone-01"}'] < 5


def test_scheduler_up(client: Any, redis_conn: Redis) -> None:
    assert scrape(client)["gpuci_scheduler_up"] == 0
    redis_conn.set(keys.scheduler_alive(), str(time.time()), ex=10)
    assert scrape(client)["gpuci_scheduler_up"] == 1


def test_redis_down_is_503() -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    client = create_app(Settings(webhook_secret=SECRET), dead).test_client()
    response = client.get("/metrics")
    assert response.status_code == 503
    assert "redis unreachable" in response.get_data(as_text=True)


def test_label_values_are_escaped() -> None:
    family = Family("x", "gauge", "help").add(1, host='a"b\\c\nd').add(2.5)
    assert render([family]).splitlines() == [
        "# HELP x help",
        "# TYPE x gauge",
        'x{host="a\\"b\\\\c\\nd"} 1',
        "x 2.5",
    ]


@pytest.mark.parametrize(("q", "expected"), [(0.0, 1), (0.5, 2), (0.9, 4), (1.0, 4)])
def test_nearest_rank_quantile(q: float, expected: float) -> None:
    assert quantile([1, 2, 3, 4], q) == expected


# --- /healthz -----------------------------------------------------------------------------------


def test_healthz_lists_what_is_degraded(client: Any, redis_conn: Redis) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.get_json()
    assert body["ok"] is True and body["redis"] == "ok" and body["status"] == "degraded"
    assert body["scheduler"] == {"alive": False, "heartbeat_age_s": None}
    assert body["hosts"] == {}
    assert len(body["degraded"]) == 2


def test_healthz_ok_with_scheduler_and_hosts_beating(client: Any, redis_conn: Redis) -> None:
    redis_conn.set(keys.scheduler_alive(), str(time.time() - 1), ex=10)
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    body = client.get("/healthz").get_json()
    assert body["status"] == "ok" and body["degraded"] == []
    assert body["scheduler"]["alive"] is True and 0.5 < body["scheduler"]["heartbeat_age_s"] < 5
    assert body["hosts"]["h20-01"]["alive"] is True


def test_healthz_names_a_lost_host(client: Any, redis_conn: Redis) -> None:
    redis_conn.set(keys.scheduler_alive(), str(time.time()), ex=10)
    publish(redis_conn, "h20-01", "sim:8xH20-96GB")
    publish(redis_conn, "gone-01", "sim:1xT4-16GB")
    redis_conn.delete(keys.host_alive("gone-01"))
    redis_conn.hset(keys.host("gone-01"), "heartbeat_at", str(time.time() - 120))
    body = client.get("/healthz").get_json()
    assert body["status"] == "degraded"
    assert body["hosts"]["gone-01"]["alive"] is False
    assert body["degraded"] == ["host gone-01: no heartbeat (last 120 s ago)"]


def test_healthz_is_503_without_redis() -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    client = create_app(Settings(webhook_secret=SECRET), dead).test_client()
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["ok"] is False and "unreachable" in response.get_json()["redis"]
