"""`gpuci demo`'s Redis: the configured one if it answers, else a private redis-server."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from redis import Redis

from bot.redis_local import RedisUnavailable, answers, local_redis

NOBODY = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_uses_the_configured_redis_when_it_answers(redis_url: str) -> None:
    with local_redis(redis_url) as url:
        assert url == redis_url


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_starts_a_private_server_and_stops_it() -> None:
    with local_redis(NOBODY) as url:
        assert url != NOBODY
        assert Redis.from_url(url).ping()
    assert not answers(url)


def test_says_how_to_get_redis_when_none_can_be_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server to be found
    with pytest.raises(RedisUnavailable, match="apt-get install redis-server"), local_redis(NOBODY):
        pass
