"""The web process as the Procfile starts it (gunicorn with bot.server.Worker, a real port,
real Redis): slow clients cannot delay a signed delivery, a request must arrive whole within
the deadline, and the intake, the dashboard and /healthz answer as they do under any server."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger
from redis import Redis

from bot import server
from bot.inbox import Envelope
from bot.redis_local import free_port
from bot.webhooks import signature_of
from contract import keys
from tests.conftest import ROOT, _redis_url

SECRET = "slow-clients-secret"
MAX_BODY = 64 * 1024
GITHUB_TIMEOUT_S = 10.0


def procfile_web() -> str:
    """The Procfile's `web:` command."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith("web:"):
            return line.removeprefix("web:").strip()
    raise AssertionError("the Procfile has no web process")


@contextlib.contextmanager
def web_process(
    redis_url: str, log: Path, options: list[str] | None = None
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`web:` from the Procfile in a shell, as a Procfile runner starts it, on a free PORT,
    with gunicorn `options` added."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUCI_")},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PORT": str(port),
        "REDIS_URL": redis_url,
        "GPUCI_WEBHOOK_SECRET": SECRET,
        "GPUCI_MAX_BODY_BYTES": str(MAX_BODY),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["sh", "-c", f"exec {procfile_web()} {shlex.join(options or [])}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            assert proc.poll() is None, f"web exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"web not serving after 30 s:\n{log.read_text()}"
            time.sleep(0.1)
        yield port, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _answers(port: int) -> bool:
    try:
        request("GET", port, "/healthz")
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def access_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("web") / "access.log"


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory, access_log: Path) -> Iterator[int]:
    """One web process for the module, on the tests' Redis database (each test's `redis_conn`
    flushes it), with an access log as the deploy unit's (`--access-logfile`)."""
    log = tmp_path_factory.mktemp("web") / "web.log"
    with web_process(_redis_url(), log, ["--access-logfile", str(access_log)]) as (port, _):
        yield port


def request(
    method: str,
    port: int,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    *,
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=GITHUB_TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        if connection is None:
            conn.close()


def delivery_headers(
    body: bytes, event: str = "pull_request", delivery: str = ""
) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": signature_of(SECRET, body),
    }


def stored_deliveries(conn: Redis) -> list[str]:
    raws: list[bytes] = conn.lrange(keys.inbox(), 0, -1)  # type: ignore[assignment]
    return [Envelope.decode(raw).delivery_id for raw in raws]


class SlowClients:
    """Connections that send a request line, then a header line every `every_s` seconds and
    never finish: when the server closes one, the time and what it said are kept."""

    def __init__(self, port: int, count: int, every_s: float = 1.0) -> None:
        self.socks: dict[socket.socket, float] = {}
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /webhook HTTP/1.1\r\nHost: gpuci\r\n")
            self.socks[sock] = time.monotonic()
        self.closed: dict[socket.socket, tuple[float, bytes]] = {}
        self.every_s, self.stop = every_s, threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _trickle(self) -> None:
        line = 0
        while not self.stop.is_set():
            line += 1
            for sock in [s for s in self.socks if s not in self.closed]:
                with contextlib.suppress(OSError):
                    sock.sendall(f"X-Trickle-{line}: still sending\r\n".encode())
            end = time.monotonic() + self.every_s
            while not self.stop.is_set() and time.monotonic() < end:
                self._collect(0.05)

    def _collect(self, wait_s: float) -> None:
        open_ = [s for s in self.socks if s not in self.closed]
        for sock in select.select(open_, [], [], wait_s)[0] if open_ else []:
            said = b""
            with contextlib.suppress(OSError):
                said = sock.recv(65536)
            while said and not said.endswith(b"\n"):  # the rest of a short answer
                with contextlib.suppress(OSError):
                    more = sock.recv(65536)
                    if not more:
                        break
                    said += more
            self.closed[sock] = (time.monotonic() - self.socks[sock], said)

    def wait_all_closed(self, within_s: float) -> None:
        end = time.monotonic() + within_s
        while len(self.closed) < len(self.socks) and time.monotonic() < end:
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for sock in self.socks:
            sock.close()


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 50])
def test_a_signed_delivery_is_stored_while_slow_clients_trickle_headers(
    web: int, redis_conn: Redis, count: int
) -> None:
    slow = SlowClients(web, count)
    try:
        time.sleep(1.5)  # every slow request has begun and trickled a line
        body, delivery = b'{"action": "opened", "number": 1}', str(uuid.uuid4())
        started = time.monotonic()
        status, _, answer = request(
            "POST", web, "/webhook", body, delivery_headers(body, delivery=delivery)
        )
        took = time.monotonic() - started
        assert (status, json.loads(answer)) == (202, {"accepted": True, "handled": True})
        assert took < GITHUB_TIMEOUT_S
        assert stored_deliveries(redis_conn) == [delivery]
        assert not slow.closed, "the slow clients were still within the deadline"

        # ...and a request that does not arrive whole in time is dropped, with a 408.
        slow.wait_all_closed(server.REQUEST_DEADLINE_S + 5)
        assert len(slow.closed) == count
        for kept_s, said in slow.closed.values():
            assert server.REQUEST_DEADLINE_S - 0.5 < kept_s < server.REQUEST_DEADLINE_S + 3
            assert said.startswith(b"HTTP/1.1 408 "), said
    finally:
        slow.close()


def test_a_connection_that_sends_nothing_is_closed_after_the_deadline(web: int) -> None:
    with socket.create_connection(("127.0.0.1", web), timeout=server.REQUEST_DEADLINE_S + 5) as s:
        started = time.monotonic()
        assert s.recv(100) == b""  # closed, without an answer: no request had begun
        assert time.monotonic() - started > server.REQUEST_DEADLINE_S - 0.5


def test_deliveries_on_one_kept_alive_connection_get_the_intakes_answers(
    web: int, redis_conn: Redis
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", web, timeout=GITHUB_TIMEOUT_S)
    body, delivery = b'{"action": "opened"}', str(uuid.uuid4())

    def post(body: bytes, **change: str) -> tuple[int, dict[str, object]]:
        headers = {**delivery_headers(body, delivery=delivery), **change}
        status, _, answer = request("POST", web, "/webhook", body, headers, connection=conn)
        return status, json.loads(answer)

    assert post(body) == (202, {"accepted": True, "handled": True})
    assert post(body) == (202, {"accepted": True, "duplicate": True})
    assert post(body, **{"X-Hub-Signature-256": "sha256=" + "0" * 64})[0] == 401
    assert post(b"{not json")[0] == 400
    assert post(b'{"zen": "Keep it logically awesome."}', **{"X-GitHub-Event": "ping"}) == (
        200,
        {"ok": True, "zen": "Keep it logically awesome."},
    )
    assert post(b"{}", **{"X-GitHub-Event": "star"}) == (202, {"accepted": True, "handled": False})
    status, headers, _ = request("GET", web, "/webhook", connection=conn)
    assert (status, headers["allow"]) == (405, "POST")
    conn.close()
    assert stored_deliveries(redis_conn) == [delivery]
    counts = redis_conn.hgetall(keys.webhook_counts())
    assert counts[b"pull_request:queued"] == b"1"
    assert counts[b"pull_request:duplicate"] == b"1"
    assert counts[b"-:rejected"] == b"2"
    assert counts[b"star:ignored"] == b"1"


def test_a_replayed_body_is_stored_once_by_the_servers_intake(web: int, redis_conn: Redis) -> None:
    body, first = b'{"action": "opened", "number": 9}', str(uuid.uuid4())
    answers = [
        request("POST", web, "/webhook", body, delivery_headers(body, delivery=delivery))
        for delivery in (first, str(uuid.uuid4()), str(uuid.uuid4()))
    ]
    assert [json.loads(a[2]) for a in answers] == [
        {"accepted": True, "handled": True},
        {"accepted": True, "duplicate": True},
        {"accepted": True, "duplicate": True},
    ]
    assert stored_deliveries(redis_conn) == [first]
    assert redis_conn.hget(keys.webhook_counts(), "pull_request:replayed") == b"2"


def test_a_utf8_signature_header_is_401_not_a_traceback(web: int, redis_conn: Redis) -> None:
    body = b'{"action": "opened"}'
    head = [f"{k}: {v}" for k, v in delivery_headers(body).items() if "Signature" not in k]
    raw = (
        ("POST /webhook HTTP/1.1\r\n" + "\r\n".join(head)).encode()
        + b"\r\nX-Hub-Signature-256: sha256=" + "\u00e9\u2603".encode() * 16
        + f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", web), timeout=5) as s:
        s.sendall(raw)
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b"signature malformed" in answer
    assert stored_deliveries(redis_conn) == []


def test_an_oversized_body_is_refused_before_it_is_sent(web: int, redis_conn: Redis) -> None:
    headers = delivery_headers(b"{}")
    lines = [f"{k}: {v}" for k, v in headers.items()] + [f"Content-Length: {MAX_BODY + 1}"]
    with socket.create_connection(("127.0.0.1", web), timeout=5) as s:
        s.sendall(("POST /webhook HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode())
        answer = _read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert f"{MAX_BODY}-byte limit".encode() in answer
    assert stored_deliveries(redis_conn) == []


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /webhook HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
        (b"POST /webhook HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"POST /webhook HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX-A: b\r\n folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX-A: b\rc\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET http://elsewhere/ HTTP/1.1\r\n\r\n", 400),
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (server.MAX_HEAD_BYTES + 10) + b"\r\n\r\n", 431),
    ],
    ids=[
        "chunked",
        "two-lengths",
        "negative-length",
        "folding",
        "bare-cr",
        "http2",
        "absolute",
        "junk",
        "huge-head",
    ],
)
def test_requests_this_server_does_not_read_are_refused_and_closed(
    web: int, raw: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", web), timeout=5) as s:
        s.sendall(raw)
        answer = _read_until_closed(s)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:80]
    assert b"Connection: close" in answer


def test_the_access_log_has_a_line_per_request(web: int, access_log: Path) -> None:
    body = b'{"action": "opened"}'
    agent = f'hookshot "{uuid.uuid4()}"'
    headers = {**delivery_headers(body), "User-Agent": agent, "Referer": "https://example.org/"}
    assert request("POST", web, "/webhook?from=test", body, headers)[0] == 202
    assert request("GET", web, "/healthz", headers={"User-Agent": agent})[0] == 200
    quoted = agent.replace('"', '\\"')
    deadline = time.monotonic() + 5
    while len(lines := [ln for ln in access_log.read_text().splitlines() if quoted in ln]) < 2:
        assert time.monotonic() < deadline, access_log.read_text()
        time.sleep(0.05)
    date = r"\[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]"
    assert re.fullmatch(
        rf'127\.0\.0\.1 - - {date} "POST /webhook\?from=test HTTP/1\.1" 202 \d+ '
        rf'"https://example\.org/" "{re.escape(quoted)}"',
        lines[0],
    )
    assert re.fullmatch(
        rf'127\.0\.0\.1 - - {date} "GET /healthz HTTP/1\.1" 200 \d+ "-" ".*"', lines[1]
    )


@pytest.mark.parametrize(
    ("raw", "peer"),
    [
        (b"POST /webhook HTTP/1.1\r\nUser-Agent: GitHub-Hookshot/044aadd", "127.0.0.1"),
        (b'GET /runs?x="1" HTTP/1.0\r\nReferer: https://a/"b"\r\nUser-Agent: "q"', ""),
        (b"POST /webhook HTTP/1.1\r\nAuthorization: Basic dTpw\r\nHost: x", "::1"),
    ],
)
def test_the_access_line_is_the_one_gunicorn_writes_by_default(
    tmp_path: Path, raw: bytes, peer: str
) -> None:
    cfg = Config()
    cfg.set("accesslog", str(tmp_path / "access.log"))
    assert cfg.access_log_format == server.COMBINED_FORMAT
    head = server.parse_head(raw)
    served, log = server._Served(202, [("Content-Type", "application/json")], 38), Logger(cfg)
    log.access(served, head, server.access_environ(head, peer), timedelta(0))
    ours = server.access_line(head, 202, 38, peer)
    log.access(served, head, server.access_environ(head, peer), timedelta(0))
    assert ours in (tmp_path / "access.log").read_text().splitlines()  # one's second is ours


def test_requests_sent_ahead_are_answered_in_order(web: int) -> None:
    raw = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 2
        + b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", web), timeout=5) as s:
        s.sendall(raw)
        answer = _read_until_closed(s)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"200", b"200", b"404"]


def test_the_dashboard_health_and_metrics_are_served_by_flask_on_the_same_port(
    web: int, redis_conn: Redis
) -> None:
    status, headers, body = request("GET", web, "/healthz")
    assert (status, json.loads(body)["redis"]) == (200, "ok")
    status, headers, _ = request("GET", web, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "Content-Security-Policy" in {k.title(): v for k, v in headers.items()}
    head_status, head_headers, nothing = request("HEAD", web, "/")
    assert (head_status, nothing) == (200, b"")
    assert int(head_headers["content-length"]) > 0
    status, _, metrics = request("GET", web, "/metrics")
    assert status == 200
    assert b"gpuci_queue_jobs" in metrics
    assert request("GET", web, "/runs/999999?token=x")[0] == 404


def test_redis_down_is_503_and_the_process_stops_on_sigterm(tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with web_process(dead, tmp_path / "web.log") as (port, proc):
        body = b'{"action": "opened"}'
        started = time.monotonic()
        status, _, answer = request("POST", port, "/webhook", body, delivery_headers(body))
        assert (status, json.loads(answer)) == (503, {"error": "queue unavailable, retry later"})
        assert time.monotonic() - started < GITHUB_TIMEOUT_S
        assert request("GET", port, "/healthz")[0] == 503
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0


def _read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_gpuci_web_serves_with_the_same_worker_and_refuses_without_a_secret(
    redis_url: str, redis_conn: Redis, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCI_")}
    gpuci = [sys.executable, "-m", "bot.cli"]
    refused = subprocess.run([*gpuci, "web"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "GPUCI_WEBHOOK_SECRET" in refused.stderr
    port = free_port()
    env |= {"GPUCI_WEBHOOK_SECRET": SECRET, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*gpuci, "web", "--port", str(port)], env=env, cwd=tmp_path, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        body = b'{"action": "opened"}'
        headers = delivery_headers(body, delivery="from-gpuci-web")
        assert request("POST", port, "/webhook", body, headers)[0] == 202
        assert stored_deliveries(redis_conn) == ["from-gpuci-web"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0
