"""Shared fixtures: a real Redis database of the tests' own, flushed around each test."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from redis import Redis

pytest_plugins = ["tests.missing_tools", "tests.sandboxing"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_REPO = ROOT / "examples" / "sample-repo"

# Each test process claims a database of its own, never 0, and flushes only that: it holds
# an flock on a lock file per database for its lifetime, so two test sessions on one machine
# (or one session's xdist workers) never share one. Databases 10-15 are tried first. Processes
# a test starts that write to the database (tests/scheduler_process.py) inherit the claim.
_FIRST_DB = int(os.environ.get("GPUCI_TEST_REDIS_DB", "10"))
NOT_FOR_TESTS = {6, 9}  # the intake bench's default and the demo's
_CLAIM: list[Any] = []  # the lock file held, and the database it claims


def _claim_db() -> int:
    if _CLAIM:
        return int(_CLAIM[1])
    order = [*range(_FIRST_DB, 16), *range(1, _FIRST_DB)]
    for db in (d for d in order if d not in NOT_FOR_TESTS):
        lock = open(Path(tempfile.gettempdir(), f"gpuci-test-redis-db-{db}.lock"), "w")  # noqa: SIM115
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        if _scheduler_leads_in(db):
            lock.close()
            continue
        _CLAIM[:] = [lock, db]
        return db
    raise RuntimeError("every Redis database 1-15 is claimed by other test processes; wait")


def _scheduler_leads_in(db: int) -> bool:
    """Whether a scheduler holds the leader lock in a database no test session claims.

    Tests flush their database when they end, so a lock there is kept by a scheduler process
    that outlived the session that started it (one killed before its teardown could run, from
    a checkout older than `db_claim_fd` and tests/scheduler_process.py's parent watch). It would
    lead, and dispatch runs, in whichever test claimed that database next: it is skipped."""
    from contract import keys

    conn = Redis.from_url(f"redis://{_redis_host()}/{db}")
    try:
        held = conn.get(keys.scheduler_leader())
    except Exception:  # no Redis: the redis_conn fixture says so
        return False
    finally:
        conn.close()
    if held is None:
        return False
    warnings.warn(
        f"Redis database {db} skipped: scheduler {held.decode(errors='replace')!r} leads there "
        "outside any test session (a leftover tests.scheduler_process? stop it)",
        stacklevel=2,
    )
    return True


def db_claim_fd() -> int:
    """The open lock file claiming this process's database. A child process given it
    (`pass_fds`) keeps the database claimed for as long as it lives, even past this process,
    so no later test session flushes and uses a database that child still writes to."""
    _claim_db()
    return int(_CLAIM[0].fileno())


def _redis_host() -> str:
    return os.environ.get("GPUCI_TEST_REDIS_HOST", "127.0.0.1:6379")


def _redis_url() -> str:
    return f"redis://{_redis_host()}/{_claim_db()}"


@pytest.fixture
def redis_url() -> str:
    return _redis_url()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[Redis]:
    conn = Redis.from_url(redis_url)
    try:
        conn.ping()
    except Exception as exc:  # pragma: no cover - environment problem, not a test result
        pytest.fail(f"tests need a Redis server at {redis_url}: {exc} (start one: redis-server)")
    conn.flushdb()
    yield conn
    conn.flushdb()
    conn.close()


# --- gpuci against fakehub: the web process, the events worker and an offline GitHub ---------

EVENTS_WORLD = Path(__file__).parent / "data" / "world-events.yml"
EVENTS_SECRET = "events-secret"


class Stack:
    """fakehub serving tests/data/world-events.yml, delivering its webhooks to gpuci's real web
    app on a real port; `process()` runs the events queue with a real RQ worker."""

    def __init__(self, hub: Any, web_url: str, redis: Redis, pump: Any = None) -> None:
        self.hub, self.web_url, self.redis = hub, web_url, redis
        self.pump = pump  # the HostLinkPump applying host messages in the background

    def _apply_host_messages(self) -> None:
        """Every host message sent so far applied: by this thread, or by the pump."""
        from bot import hostlink

        hostlink.drain(self.redis)
        if self.pump is not None:
            self.pump.settle()

    def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = requests.request(method, f"{self.hub.url}/_fakehub/{path}", json=body, timeout=30)
        assert answer.status_code < 300, answer.text
        return answer.json()

    def open_pr(
        self,
        author: str,
        ref: str,
        *,
        head_repo: str | None = None,
        repo: str = "acme/gpu",
        draft: bool = False,
    ) -> Any:
        """Open a PR from branch `ref` of `head_repo` (default: `repo`); fakehub sends opened."""
        head = {"ref": ref, "repo": head_repo or repo}
        body = {"repo": repo, "author": author, "head": head, "draft": draft}
        found = self.control("POST", "pulls", body)
        assert found["delivery"]["status_code"] == 202, found["delivery"]
        return found["pull"]

    def process(self, queue_name: str = "gpuci-events") -> int:
        """Work one queue (default: the events queue, fed from the webhook inbox as the events
        process's pump does) until both are empty; every job must succeed."""
        from rq import Queue, SimpleWorker
        from rq.job import Job
        from rq.registry import FailedJobRegistry

        from bot.inbox import EVENTS_QUEUE, Pump

        queue = Queue(queue_name, connection=self.redis)
        pump = Pump(self.redis) if queue_name == EVENTS_QUEUE else None
        self._apply_host_messages()  # hosts' messages, as the events process's pump applies them
        while (pump.drain() if pump else 0) or queue.count:
            SimpleWorker([queue], connection=self.redis).work(burst=True)
        failed = FailedJobRegistry(queue=queue).get_job_ids()
        for job_id in failed:
            result = Job.fetch(job_id, connection=self.redis).latest_result()
            pytest.fail(f"{queue_name} job failed:\n{result.exc_string if result else job_id}")
        return len(failed)

    def work_host(self) -> int:
        """Run this host's tickets here, one after another (as `gpuci worker --burst` would,
        without a process per run), then apply its messages; how many tickets ran."""
        from contract.settings import Settings
        from workers.host import work_burst

        done = work_burst(self.redis, Settings.from_env())
        self._apply_host_messages()
        return done

    def deliver(self, event: str, payload: dict[str, Any], delivery_id: str) -> None:
        """A signed webhook straight to gpuci, for events fakehub does not send."""
        from bot.webhooks import signature_of

        body = json.dumps(payload).encode()
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery_id,
            "X-Hub-Signature-256": signature_of(EVENTS_SECRET, body),
        }
        answer = requests.post(f"{self.web_url}/webhook", data=body, headers=headers, timeout=10)
        assert answer.status_code == 202, answer.text

    def state(self) -> Any:
        return self.control("GET", "state")

    def checks(self, sha: str) -> dict[str, dict[str, Any]]:
        """The latest check run of each name at `sha`, as GitHub shows them: name -> fields."""
        latest: dict[str, dict[str, Any]] = {}
        for run in sorted(self.state()["check_runs"], key=lambda r: r["id"]):
            if run["head_sha"] == sha:
                latest[run["fields"]["name"]] = {"id": run["id"], **run["fields"]}
        return latest

    def comments(self, number: int, repo: str = "acme/gpu") -> list[dict[str, Any]]:
        found = self.state()["comments"]
        return [c for c in found if c["repo"] == repo and c["issue_number"] == number]


@contextlib.contextmanager
def serve_stack(
    world_path: Path,
    redis_conn: Redis,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Stack]:
    """fakehub with `world_path` delivering to gpuci's web app on a real port; the environment
    the events, scheduler and worker processes read their settings from."""
    from app import create_app
    from bot.hostlink import HostLinkPump
    from contract.settings import Settings
    from fakehub.testing import running, serving
    from fakehub.world import load_world

    world = load_world(world_path)
    key = tmp_path / "app.pem"
    assert world.app.private_key_pem is not None
    key.write_bytes(world.app.private_key_pem)
    web = create_app(Settings(webhook_secret=EVENTS_SECRET, redis_url=redis_url), redis_conn)
    with serving(web) as server:
        web_url = f"http://127.0.0.1:{server.port}"
        with running(world, webhook_url=f"{web_url}/webhook", webhook_secret=EVENTS_SECRET) as hub:
            for name, value in {
                "REDIS_URL": redis_url,
                "GPUCI_APP_ID": str(world.app.id),
                "GPUCI_PRIVATE_KEY_PATH": str(key),
                "GPUCI_GITHUB_API_URL": hub.url,
                "GPUCI_PUBLIC_URL": "https://gpuci.example.org",
                "GPUCI_GITHUB_WRITE_INTERVAL_S": "0",
            }.items():
                monkeypatch.setenv(name, value)
            # the GPU hosts' messages applied as they come, as the events process does
            pump = HostLinkPump(Redis.from_url(redis_url))
            pump.start()
            try:
                yield Stack(hub, web_url, redis_conn, pump)
            finally:
                pump.stop()


@pytest.fixture
def stack(
    redis_conn: Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    with serve_stack(EVENTS_WORLD, redis_conn, redis_url, tmp_path, monkeypatch) as found:
        yield found
