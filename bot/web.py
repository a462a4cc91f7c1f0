"""HTTP views of the web process: health."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue
from redis import Redis
from redis.exceptions import RedisError

from bot import dashboard
from bot.leader import leader_view
from contract.redis_errors import redis_problem
from contract.settings import Settings

blueprint = Blueprint("gpuci", __name__)


def settings() -> Settings:
    value: Settings = current_app.config["GPUCI_SETTINGS"]
    return value


@blueprint.get("/healthz")
def healthz() -> ResponseReturnValue:
    """200 while Redis answers (degraded parts listed: scheduler, hosts); 503 when it does not."""
    conn: Redis = current_app.extensions["gpuci_redis"]
    try:
        conn.ping()
        parts = health(conn, time.time())
    except RedisError as exc:
        return jsonify(ok=False, status="unavailable", redis=redis_problem(exc)), 503
    return jsonify(ok=True, redis="ok", **parts)


def health(conn: Redis, now: float) -> dict[str, Any]:
    """The scheduler's and each host's heartbeat, which scheduler leads, and what is degraded
    in words."""
    alive, age = dashboard.scheduler_heartbeat(conn, now)
    lead = leader_view(conn, now)
    hosts = dashboard.read_hosts(conn, now)
    degraded = [] if alive else ["scheduler: not heartbeating (pending runs are not assigned)"]
    if not hosts:
        degraded.append("hosts: no GPU host has registered")
    for host in hosts:
        if not host.alive:
            since = "never" if host.heartbeat_age_s is None else f"{host.heartbeat_age_s:.0f} s"
            degraded.append(f"host {host.name}: no heartbeat (last {since} ago)")
    return {
        "status": "degraded" if degraded else "ok",
        "scheduler": {"alive": alive, "heartbeat_age_s": _rounded(age)},
        "leader": {
            "scheduler": lead.leader or None,
            "term": lead.term,
            "lock_expires_in_s": _rounded(lead.expires_in_s),
            "standby": list(lead.standby),
        },
        "hosts": {
            h.name: {"alive": h.alive, "heartbeat_age_s": _rounded(h.heartbeat_age_s)}
            for h in hosts
        },
        "degraded": degraded,
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
