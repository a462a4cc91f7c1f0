"""Replay webhook deliveries gpuci missed (answered 5xx or not reached, e.g. while Redis was
down) through GitHub's deliveries API: list the App's recent deliveries, ask GitHub to send
again each failed one not delivered since, and remember when it last looked."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Set
from typing import Any

from github import GithubException
from redis import Redis

from bot.github_app import GitHubApp
from bot.timestamps import epoch
from contract import keys

log = logging.getLogger("gpuci.redeliver")

PER_PAGE = 100
MAX_PAGES = 10  # at most 1000 deliveries looked at per check
OVERLAP_S = 300  # a check starts this long before the last one (clock skew, slow deliveries)
LOOKBACK_S = 3600  # without a recorded check (a fresh Redis), look back this far
MAX_LOOKBACK_S = 3 * 24 * 3600  # GitHub keeps deliveries for redelivery this long


def _succeeded(delivery: Mapping[str, Any]) -> bool:
    return delivery.get("status") == "OK"


def _retryable(delivery: Mapping[str, Any]) -> bool:
    """Failed in a way a later attempt can fix: a 5xx answer, or no answer at all (code 0).
    A 4xx (bad signature, bad body) would fail again, so it is not retried."""
    code = int(delivery.get("status_code") or 0)
    return not _succeeded(delivery) and (code == 0 or code >= 500)


def deliveries_to_redeliver(
    deliveries: Iterable[Mapping[str, Any]], seen: Set[str], since: float
) -> list[Mapping[str, Any]]:
    """The deliveries to send again, one per guid (its newest failed attempt), oldest first:
    a delivery at or after `since` (GitHub's timestamps have whole seconds) that failed with a
    5xx or no answer, whose guid no attempt delivered OK and whose guid is not in `seen` (the
    web process took it: `X-GitHub-Delivery` is the guid)."""
    by_guid: dict[str, list[Mapping[str, Any]]] = {}
    for delivery in deliveries:
        by_guid.setdefault(str(delivery.get("guid") or ""), []).append(delivery)
    chosen = []
    for guid, attempts in by_guid.items():
        if not guid or guid in seen or any(_succeeded(d) for d in attempts):
            continue
        failed = [d for d in attempts if _retryable(d) and _at(d) + 1 > since]
        if failed:
            chosen.append(max(failed, key=lambda d: (_at(d), int(d.get("id") or 0))))
    return sorted(chosen, key=lambda d: (_at(d), int(d.get("id") or 0)))


def _at(delivery: Mapping[str, Any]) -> float:
    return epoch(delivery.get("delivered_at")) or 0.0


def recent_deliveries(app: GitHubApp, since: float) -> list[dict[str, Any]]:
    """The App's deliveries, newest first, back to `since` (following the `cursor` of the
    `Link` header for at most MAX_PAGES pages)."""
    requester = app.integration.requester
    found: list[dict[str, Any]] = []
    params: dict[str, Any] = {"per_page": PER_PAGE}
    for _ in range(MAX_PAGES):
        headers, page = requester.requestJsonAndCheck(
            "GET", "/app/hook/deliveries", parameters=params
        )
        app.meter("GET", "2xx", -1)
        page = list(page or [])
        found += page
        cursor = _next_cursor(headers)
        if not page or cursor is None or _at(page[-1]) + 1 <= since:
            break
        params = {"per_page": PER_PAGE, "cursor": cursor}
    return found


def _next_cursor(headers: Mapping[str, Any]) -> str | None:
    link = next((str(v) for k, v in headers.items() if k.lower() == "link"), "")
    for part in link.split(","):
        url, _, rel = part.partition(";")
        if 'rel="next"' in rel:
            query = urllib.parse.urlparse(url.strip().strip("<>")).query
            return urllib.parse.parse_qs(query).get("cursor", [None])[0]
    return None


def redeliver_failed(app: GitHubApp, conn: Redis, since: float) -> list[str]:
    """Ask GitHub to send again every delivery since `since` that gpuci missed (see
    `deliveries_to_redeliver`); the guids asked for. Records the check's start time."""
    started = time.time()
    deliveries = recent_deliveries(app, since)
    guids = sorted({str(d.get("guid")) for d in deliveries if d.get("guid") and _retryable(d)})
    pipe = conn.pipeline(transaction=False)
    for guid in guids:
        pipe.exists(keys.delivery(guid))
    seen = {guid for guid, found in zip(guids, pipe.execute(), strict=True) if found}
    redelivered = []
    for delivery in deliveries_to_redeliver(deliveries, seen, since):
        path = f"/app/hook/deliveries/{int(delivery['id'])}/attempts"
        try:
            app.integration.requester.requestJsonAndCheck("POST", path)
        except GithubException as exc:
            app.meter("POST", str(exc.status), -1)
            log.warning("redelivery of guid=%s failed: %s", delivery.get("guid"), exc)
            continue
        app.meter("POST", "2xx", -1)
        redelivered.append(str(delivery["guid"]))
        log.info(
            "redelivered guid=%s event=%s action=%s (was %s)",
            delivery.get("guid"), delivery.get("event"), delivery.get("action"),
            delivery.get("status"),
        )  # fmt: skip
    conn.set(keys.redeliver_checked(), f"{started:.3f}")
    return redelivered


def since_last_check(conn: Redis, now: float | None = None) -> float:
    """Where the next check starts: the last one less OVERLAP_S, else LOOKBACK_S ago; never
    before GitHub's redelivery window."""
    now = time.time() if now is None else now
    raw = conn.get(keys.redeliver_checked())
    since = float(raw) - OVERLAP_S if raw else now - LOOKBACK_S
    return max(since, now - MAX_LOOKBACK_S)
