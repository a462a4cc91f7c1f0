"""The web process's access log as deploy/systemd/gpuci-web.service writes it: the dashboard's
token (in the URL, a bearer header or the session cookie) never reaches a log line."""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot import accesslog
from bot.dashboard import COOKIE, cookie_value
from bot.redis_local import free_port
from contract.redact import REDACTED
from tests.conftest import ROOT

TOKEN = "dash-t0ken-9f8e7d"
# Every atom that could carry the token: request line, path, query, headers, environ.
VERBOSE_FORMAT = (
    '%(h)s "%(r)s" %(s)s U=%(U)s q=%(q)s f=%(f)s auth=%({authorization}i)s '
    "cookie=%({cookie}i)s set=%({set-cookie}o)s raw=%({raw_uri}e)s qs=%({query_string}e)s"
)


def unit_command(port: int, log: Path) -> list[str]:
    """The systemd unit's ExecStart, on this machine's gunicorn, a free port and a log file."""
    unit = (ROOT / "deploy" / "systemd" / "gpuci-web.service").read_text()
    (line,) = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    argv[0] = str(Path(sys.executable).parent / "gunicorn")
    argv[argv.index("--bind") + 1] = f"127.0.0.1:{port}"
    argv[argv.index("--access-logfile") + 1] = str(log)
    return argv


@contextlib.contextmanager
def web(redis_url: str, log: Path, *extra: str) -> Iterator[int]:
    port = free_port()
    argv = unit_command(port, log)
    argv[-1:-1] = list(extra)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUCI_")},
        "REDIS_URL": redis_url,
        "GPUCI_WEBHOOK_SECRET": "access-log-secret",
        "GPUCI_DASHBOARD_TOKEN": TOKEN,
    }
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                get(port, "/healthz")
                break
            assert proc.poll() is None and time.monotonic() < deadline, "web did not start"
            time.sleep(0.1)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def get(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def visit_with_the_token(port: int) -> None:
    assert get(port, f"/?token={TOKEN}") == 303  # to a cookie, the token off the address bar
    assert get(port, f"/runs/1?x=1&token={TOKEN}", {"Referer": f"/?token={TOKEN}"}) == 303
    assert get(port, "/", {"Authorization": f"Bearer {TOKEN}"}) == 200
    assert get(port, "/", {"Cookie": f"{COOKIE}={cookie_value(TOKEN)}"}) == 200


def read_log(log: Path, lines: int) -> str:
    deadline = time.monotonic() + 10
    while len(log.read_text().splitlines()) < lines and time.monotonic() < deadline:
        time.sleep(0.05)
    return log.read_text()


@pytest.mark.slow
def test_the_units_access_log_never_shows_the_dashboard_token(
    redis_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "access.log"
    with web(redis_url, log) as port:
        visit_with_the_token(port)
        text = read_log(log, 5)
    assert TOKEN not in text
    assert f"GET /?token={REDACTED} HTTP/1.1" in text
    assert f"GET /runs/1?x=1&token={REDACTED} HTTP/1.1" in text


@pytest.mark.slow
def test_no_access_log_format_can_show_it(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    with web(redis_url, log, "--access-logformat", VERBOSE_FORMAT) as port:
        visit_with_the_token(port)
        text = read_log(log, 5)
    assert TOKEN not in text
    assert cookie_value(TOKEN) not in text
    assert f"q=x=1&token={REDACTED}" in text
    assert f"auth={REDACTED}" in text and f"cookie={REDACTED}" in text


def test_werkzeugs_request_lines_are_redacted_too(caplog: pytest.LogCaptureFixture) -> None:
    accesslog.install()
    accesslog.install()  # once per process, however often apps are made
    logger = logging.getLogger("werkzeug")
    assert sum(isinstance(f, accesslog.Redacting) for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger="werkzeug"):
        logger.info('%s - - "%s" %s', "127.0.0.1", f"GET /?token={TOKEN} HTTP/1.1", "303")
    assert TOKEN not in caplog.text
    assert f"/?token={REDACTED}" in caplog.text
