"""Shared fixtures: a real Redis database of the tests' own, flushed around each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_REPO = ROOT / "examples" / "sample-repo"

# Tests use databases 10-15 (one per xdist worker), never 0, and flush only their own.
_BASE_DB = int(os.environ.get("GPUCI_TEST_REDIS_DB", "10"))


def _redis_url() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    db = _BASE_DB + (int(worker) if worker.isdigit() else 0) % 6
    host = os.environ.get("GPUCI_TEST_REDIS_HOST", "127.0.0.1:6379")
    return f"redis://{host}/{db}"


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
