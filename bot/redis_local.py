"""A Redis to use locally: the configured one if it answers, else a private redis-server."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from redis import Redis
from redis.exceptions import RedisError


class RedisUnavailable(RuntimeError):
    """No Redis answers and none can be started; the message says how to get one."""


def answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except RedisError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def local_redis(url: str) -> Iterator[str]:
    """Yield `url` if a server answers there, else the URL of a private one stopped on exit."""
    if answers(url):
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable(
            f"no Redis answers at {url} and redis-server is not installed: "
            "install it (apt-get install redis-server) or set REDIS_URL"
        )
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpuci-redis-") as workdir:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        private = f"redis://127.0.0.1:{port}/0"
        try:
            _wait_for(private, proc)
            yield private
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _wait_for(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while not answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RedisUnavailable(f"redis-server did not start at {url}")
        time.sleep(0.05)
