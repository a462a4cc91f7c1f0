"""A redis-server of a test's own on a free port: stopped and started again at will, with or
without the persistence production uses (deploy/redis-persistence.conf)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from bot.github_app import GitHubApp
from bot.redis_local import answers, free_port
from tests.conftest import ROOT, Stack, serve_stack

PERSISTENCE_CONF = ROOT / "deploy" / "redis-persistence.conf"


class PrivateRedis:
    """One redis-server on a fixed port and directory. `stop()` is what systemd does to stop
    it (SIGTERM: a persistent server writes its data first); `start()` again finds that data
    when `persistent`. After `close()` it stays stopped, whatever thread asks."""

    def __init__(
        self, workdir: Path, *, persistent: bool = False, aclfile: Path | None = None
    ) -> None:
        self.port, self.workdir, self.persistent = free_port(), workdir, persistent
        self.aclfile = aclfile
        self.url = f"redis://127.0.0.1:{self.port}/0"
        if aclfile is not None:  # `url` is the bot's: the ACL's default user is off
            self.url = self.url_as("gpuci-bot", "bot-password")
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed = False
        self._lock = threading.Lock()

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        assert binary is not None
        config = [str(PERSISTENCE_CONF)] if self.persistent else []
        options = [] if self.persistent else ["--save", "", "--appendonly", "no"]
        where = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        acl = ["--aclfile", str(self.aclfile)] if self.aclfile else []
        return [binary, *config, *where, *options, *acl]

    def url_as(self, user: str, password: str) -> str:
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def start(self) -> None:
        with self._lock:
            assert not self.closed, "the test is over"
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.proc = subprocess.Popen(
                self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 10
            while not answers(self.url):
                assert self.proc.poll() is None and time.monotonic() < deadline, "no redis-server"
                time.sleep(0.05)

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._stop()

    def _stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None


@contextlib.contextmanager
def private_redis_server(
    workdir: Path, *, persistent: bool = False, aclfile: Path | None = None
) -> Iterator[PrivateRedis]:
    """A started PrivateRedis, stopped at the end; the test is skipped without redis-server."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    server = PrivateRedis(workdir, persistent=persistent, aclfile=aclfile)
    server.start()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def stack_on(
    server: PrivateRedis, world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Stack, GitHubApp]]:
    """serve_stack with `world`, the web app and every gpuci process on the private Redis;
    an App client on fakehub for the test's own calls."""
    conn = Redis.from_url(server.url, socket_timeout=5, socket_connect_timeout=1)
    try:
        with serve_stack(world, conn, server.url, tmp_path, monkeypatch) as stack:
            pem = stack.hub.world.app.private_key_pem
            assert pem is not None
            app = GitHubApp(stack.hub.url, stack.hub.world.app.id, pem.decode(), write_interval_s=0)
            yield stack, app
    finally:
        conn.close()
