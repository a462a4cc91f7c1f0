"""Benchmark: webhook intake, gpuci's production server against a minimal Probot 14 app.

Both servers get signed real `pull_request` "opened" deliveries (about 21 KB) from wrk, each
request with a fresh `X-GitHub-Delivery` and a body of its own (gpuci takes a body it has seen
under another id for a replay and stores it once), at 1 and 16 connections. gpuci runs as in the
Procfile (gunicorn, 2 `bot.server.Worker` workers) against Redis database 6 (flushed at
start, between runs and at exit); afterwards the deliveries in its webhook inbox are counted
against its 202 answers.

`--slowloris N [N ...]` measures instead what slow clients do to a delivery: N connections
send a request line and then one header line every `--trickle` seconds (never finishing; one
the server drops is opened again) while a single prober sends signed deliveries one after
another, each on a new connection with GitHub's 10 s timeout; it prints the prober's worst
latency and how long the server kept the slow connections.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import secrets
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from redis import Redis

from bot import inbox
from bot.redis_local import free_port
from bot.webhooks import signature_of
from contract import keys
from fakehub.schema import webhook_examples

ROOT = Path(__file__).resolve().parent.parent
PROBOT_DIR = ROOT / "bench" / "probot"
DEFAULT_REDIS = "redis://127.0.0.1:6379/6"
WORKER_CLASS = "bot.server.Worker"  # the Procfile's
EVENT = "pull_request"

# wrk script: request n (counted per thread from the thread's number, stepping by the number
# of threads) carries body prefix .. (n % count) .. suffix and that body's signature, read from
# the signatures file (line k signs body k; wrk cannot compute HMACs), and a fresh random UUID
# as X-GitHub-Delivery; counts answers by status and prints one JSON line at the end.
# Arguments: prefix file, suffix file, signatures file, event, seed, threads.
WRK_LUA = r"""
local prefix, suffix, event, n, step, head
local sigs = {}
local threads = {}
s200, s202, sother = 0, 0, 0

function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

function init(args)
  prefix, suffix = read(args[1]), read(args[2])
  for line in io.lines(args[3]) do sigs[#sigs + 1] = line end
  event = args[4]
  math.randomseed(tonumber(args[5]) + tid * 7919)
  n, step = tid - 1, tonumber(args[6])
  head = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port ..
    "\r\nContent-Type: application/json\r\nUser-Agent: GitHub-Hookshot/bench" ..
    "\r\nX-GitHub-Event: " .. event .. "\r\nContent-Length: "
end

local function uuid4()
  local r = math.random
  return string.format("%04x%04x-%04x-4%03x-%04x-%04x%04x%04x", r(0, 65535), r(0, 65535),
    r(0, 65535), r(0, 4095), r(32768, 49151), r(0, 65535), r(0, 65535), r(0, 65535))
end

function request()  -- one concatenation (wrk.format copies the 21 KB body twice more)
  local k = n % #sigs
  n = n + step
  return head .. (#prefix + #suffix + #tostring(k)) .. "\r\nX-GitHub-Delivery: " .. uuid4() ..
    "\r\nX-Hub-Signature-256: " .. sigs[k + 1] .. "\r\n\r\n" .. prefix .. k .. suffix
end

function response(status, headers, body)
  if status == 202 then s202 = s202 + 1
  elseif status == 200 then s200 = s200 + 1
  else sother = sother + 1 end
end

function done(summary, latency, requests)
  local c200, c202, cother = 0, 0, 0
  for _, t in ipairs(threads) do
    c200 = c200 + t:get("s200")
    c202 = c202 + t:get("s202")
    cother = cother + t:get("sother")
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"s200":%d,"s202":%d,"sother":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"timeout":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, c200, c202, cother, e.connect, e.read, e.write,
    e.timeout))
end
"""


@dataclass(frozen=True)
class Result:
    server: str
    connections: int
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    accepted: int  # 202 (gpuci) or 200 (Probot)
    other: int  # other statuses
    socket_errors: int
    check: str  # what was verified after the run
    cpu: str  # server / wrk / Redis CPU during the run, percent of one core

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


class Processes:
    """Every process the bench starts, each in its own session; all killed on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, grace_s: float = 5.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Workers or children left in the group (the leader already gone) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


def payload_body() -> bytes:
    """GitHub's real `pull_request` "opened" example, compact (about 21 KB), with the
    `installation` object that every GitHub App delivery carries."""
    opened = next(
        payload
        for event, payload in webhook_examples()
        if event == "pull_request" and payload.get("action") == "opened"
    )
    opened = {
        **opened,
        "installation": {"id": 2, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMg=="},
    }
    return json.dumps(opened, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Deliveries:
    """Signed bodies that differ only in a "bench" field put first: its value is the request's
    number for wrk's (signatures computed here beforehand), any other text for the bench's
    own deliveries (readiness, the slow-client prober)."""

    secret: str
    prefix: bytes
    suffix: bytes

    @classmethod
    def of(cls, body: bytes) -> Deliveries:
        assert body.startswith(b"{")
        return cls(secrets.token_hex(20), b'{"bench":"', b'",' + body[1:])

    def signed(self, tag: str) -> tuple[bytes, str]:
        body = self.prefix + tag.encode() + self.suffix
        return body, signature_of(self.secret, body)

    def wrk_files(self, tmp: Path, count: int) -> list[Path]:
        """The Lua script and its files: prefix, suffix and the signatures of bodies 0..count-1."""
        files = [tmp / name for name in ("signed.lua", "prefix", "suffix", "signatures")]
        files[0].write_text(WRK_LUA)
        files[1].write_bytes(self.prefix)
        files[2].write_bytes(self.suffix)
        with files[3].open("w") as out:
            for n in range(count):
                out.write(self.signed(str(n))[1] + "\n")
        return files


def throwaway_private_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()


def post(url: str, delivery: tuple[bytes, str], timeout_s: float = 5) -> int:
    body, signature = delivery
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "X-GitHub-Event": EVENT,
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": signature,
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_ready(proc: subprocess.Popen, url: str, deliveries: Deliveries, log: Path) -> None:
    """Until one signed delivery is accepted (200 or 202); the server's log if it dies."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited ({proc.returncode}) before it was ready:\n{log.read_text()}")
        with contextlib.suppress(OSError):
            status = post(url, deliveries.signed(f"ready-{uuid.uuid4()}"))
            if status in (200, 202):
                return
            sys.exit(f"{url} answered {status} to a signed delivery:\n{log.read_text()}")
        time.sleep(0.2)
    sys.exit(f"{url} not ready after 60 s:\n{log.read_text()}")


def wrk(
    url: str, connections: int, duration_s: int, threads: int, files: list[Path]
) -> dict[str, float]:
    threads = min(threads, connections)
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--timeout",
        "10s",
        "-s",
        str(files[0]),
        url,
        "--",
        *(str(f) for f in files[1:]),
        EVENT,
        str(secrets.randbelow(2**31)),
        str(threads),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"^WRKJSON (\{.*\})$", out, re.M)
    if not match:
        sys.exit(f"wrk printed no result:\n{out}")
    raw: dict[str, float] = json.loads(match.group(1))
    raw["wrk_cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return raw


def group_cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of a process group (a server)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(conn: Redis) -> float:
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measured(
    args: argparse.Namespace,
    url: str,
    connections: int,
    pgid: int,
    files: list[Path],
) -> dict[str, float]:
    """One wrk run, with the CPU that the server, wrk and Redis used during it."""
    conn = Redis.from_url(args.redis_url)
    server0, redis0 = group_cpu_s(pgid), redis_cpu_s(conn)
    raw = wrk(url, connections, args.duration, args.wrk_threads, files)
    raw["server_cpu"] = group_cpu_s(pgid) - server0
    raw["redis_cpu"] = redis_cpu_s(conn) - redis0
    return raw


def to_result(
    server: str, connections: int, raw: dict[str, float], accepted: float, check: str
) -> Result:
    seconds = raw["duration_us"] / 1e6
    cpu = " / ".join(
        f"{raw[k] / seconds * 100:.0f}%" for k in ("server_cpu", "wrk_cpu", "redis_cpu")
    )
    return Result(
        server=server,
        connections=connections,
        requests=int(raw["requests"]),
        seconds=raw["duration_us"] / 1e6,
        p50_ms=raw["p50_us"] / 1e3,
        p90_ms=raw["p90_us"] / 1e3,
        p99_ms=raw["p99_us"] / 1e3,
        max_ms=raw["max_us"] / 1e3,
        accepted=int(accepted),
        other=int(raw["requests"] - accepted),
        socket_errors=int(raw["connect"] + raw["read"] + raw["write"] + raw["timeout"]),
        check=check,
        cpu=cpu,
    )


def settle(conn: Redis) -> int:
    """The deliveries in the inbox once it stops growing (requests in flight at wrk's stop)."""
    last, stable_since = -1, time.monotonic()
    while time.monotonic() - stable_since < 0.5:
        n = inbox.pending(conn)
        if n != last:
            last, stable_since = n, time.monotonic()
        time.sleep(0.05)
    return last


def bench_gpuci(
    args: argparse.Namespace, procs: Processes, tmp: Path, deliveries: Deliveries, files: list[Path]
) -> list[Result]:
    conn = Redis.from_url(args.redis_url)
    conn.flushdb()
    port = free_port()
    env = {
        **os.environ,
        "GPUCI_WEBHOOK_SECRET": deliveries.secret,
        "REDIS_URL": args.redis_url,
        "PYTHONUNBUFFERED": "1",
    }
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    cmd = [gunicorn, "--bind", f"127.0.0.1:{port}", "--workers", str(args.workers)]
    cmd += ["--worker-class", args.worker_class]
    if args.worker_class == "gthread":
        cmd += ["--threads", str(args.threads)]
    if args.access_log:
        cmd += ["--access-logfile", str(tmp / "access.log")]
    cmd.append("app:create_app()")
    log = tmp / "gunicorn.log"
    proc = procs.start(cmd, env, log, ROOT)
    url = f"http://127.0.0.1:{port}/webhook"
    wait_ready(proc, url, deliveries, log)
    if args.slowloris:
        for n in args.slowloris:
            conn.flushdb()
            probe = slow_clients(args, url, n, deliveries)
            stored = settle(conn)
            late = stored - probe.accepted  # stored, but answered after the prober gave up
            ok = 0 <= late <= probe.timeouts and probe.other == 0
            probe.check = (
                f"{'OK' if ok else 'MISMATCH'}: {stored} deliveries in the inbox, "
                f"{probe.accepted} 202s seen by the prober (+{late} after its 10 s)"
            )
            probe.server = "gpuci"
            print(probe.line())
        procs.stop(proc)
        conn.flushdb()
        return []
    wrk(url, 16, args.warmup, args.wrk_threads, files)
    results = []
    for connections in args.connections:
        settle(conn)
        conn.flushdb()
        raw = measured(args, url, connections, proc.pid, files)
        jobs = settle(conn)
        found: dict[bytes, bytes] = conn.hgetall(keys.webhook_counts())  # type: ignore[assignment]
        counts = {k.decode(): int(v) for k, v in found.items()}
        queued = counts.get(f"{EVENT}:queued", 0)
        dupes = counts.get(f"{EVENT}:duplicate", 0)
        replays = counts.get(f"{EVENT}:replayed", 0)
        extra = jobs - raw["s202"]
        ok = dupes == replays == raw["sother"] == 0 and jobs == queued and 0 <= extra <= connections
        hint = "" if ok else " (is another client using or flushing this database?)"
        if replays:
            hint = f" (more requests than --bodies {args.bodies}: raise it)"
        check = (
            f"{'OK' if ok else 'MISMATCH'}{hint}: {jobs} deliveries in the inbox, "
            f"{raw['s202']} 202s seen by wrk (+{extra} answered after wrk stopped), "
            f"{queued} counted queued, {dupes} duplicates, {replays} replays"
        )
        results.append(to_result("gpuci", connections, raw, raw["s202"], check))
    procs.stop(proc)
    conn.flushdb()
    return results


def bench_probot(
    args: argparse.Namespace, procs: Processes, tmp: Path, deliveries: Deliveries, files: list[Path]
) -> list[Result]:
    port = free_port()
    env = {
        **os.environ,
        "APP_ID": "1",
        "PRIVATE_KEY": throwaway_private_key(),
        "WEBHOOK_SECRET": deliveries.secret,
        "PORT": str(port),
        "HOST": "127.0.0.1",
        "LOG_LEVEL": "warn",  # gpuci's INFO lines go nowhere under gunicorn either
        "NODE_ENV": "production",
    }
    log = tmp / "probot.log"
    proc = procs.start([args.probot_bin, "run", "./index.js"], env, log, PROBOT_DIR)
    url = f"http://127.0.0.1:{port}/api/github/webhooks"
    wait_ready(proc, url, deliveries, log)
    if args.slowloris:
        for n in args.slowloris:
            probe = slow_clients(args, url, n, deliveries)
            probe.server, probe.check = "Probot", f"{probe.accepted} 200s"
            print(probe.line())
        procs.stop(proc)
        return []
    wrk(url, 16, args.warmup, args.wrk_threads, files)
    results = []
    for connections in args.connections:
        raw = measured(args, url, connections, proc.pid, files)
        check = f"{raw['s200']} 200s, {raw['sother']} other statuses"
        results.append(to_result("Probot", connections, raw, raw["s200"], check))
    procs.stop(proc)
    handled = re.search(r"probot-bench counts (\{.*\})", log.read_text())
    if handled:
        total = sum(json.loads(handled.group(1)).values())
        print(f"Probot handlers counted {total} deliveries (readiness + warm-up + runs)")
    return results


class Slowloris:
    """`count` connections that each send a request line, then one header line every
    `every_s` seconds, and never finish; a connection the server closes (or answers) is
    timed and opened again, so `count` stay open."""

    def __init__(self, url: str, count: int, every_s: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.address = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.start_line = f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\n".encode()
        self.count, self.every_s = count, every_s
        self.open: dict[socket.socket, float] = {}
        self.lifetimes: list[float] = []  # seconds each dropped connection was kept
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def __enter__(self) -> Slowloris:
        for _ in range(self.count):
            self._open_one()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for sock in self.open:
            sock.close()

    def _open_one(self) -> None:
        sock = socket.create_connection(self.address, timeout=5)
        sock.sendall(self.start_line)
        self.open[sock] = time.monotonic()

    def _run(self) -> None:
        lines, next_line = 0, time.monotonic() + self.every_s
        while not self.stop.is_set():
            readable, _, _ = select.select(list(self.open), [], [], 0.05)
            for sock in readable:  # the server answered (408) or closed: dropped
                with contextlib.suppress(OSError):
                    sock.recv(65536)
                self.lifetimes.append(time.monotonic() - self.open.pop(sock))
                sock.close()
                with contextlib.suppress(OSError):
                    self._open_one()
            if time.monotonic() >= next_line:
                lines += 1
                for sock in list(self.open):
                    with contextlib.suppress(OSError):
                        sock.sendall(f"X-Slow-{lines}: {'x' * 20}\r\n".encode())
                next_line += self.every_s


@dataclass
class Probe:
    slow: int
    sent: int
    accepted: int
    other: int
    timeouts: int
    latencies_ms: list[float]
    lifetimes_s: list[float]
    server: str = ""
    check: str = ""

    def line(self) -> str:
        worst = (
            "over 10 s (timed out)"
            if self.timeouts
            else f"{max(self.latencies_ms, default=float('nan')):.1f} ms"
        )
        p50 = statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")
        kept = (
            f"dropped {len(self.lifetimes_s)} times, after {min(self.lifetimes_s):.1f}-"
            f"{max(self.lifetimes_s):.1f} s"
            if self.lifetimes_s
            else "never dropped"
        )
        return (
            f"{self.server} with {self.slow} slow connections: {self.sent} deliveries, "
            f"{self.accepted} answered 2xx, {self.other} other, {self.timeouts} past 10 s; "
            f"prober p50 {p50:.1f} ms, worst {worst}; slow connections {kept}; "
            f"{self.check}"
        )


def slow_clients(args: argparse.Namespace, url: str, count: int, deliveries: Deliveries) -> Probe:
    """Signed deliveries one after another for `--slow-duration` s while `count` slow
    connections trickle headers."""
    latencies, accepted, other, timeouts, sent = [], 0, 0, 0, 0
    with Slowloris(url, count, args.trickle) as slow:
        time.sleep(min(args.trickle, 1.0))  # the slow requests have begun
        end = time.monotonic() + args.slow_duration
        while time.monotonic() < end:
            sent += 1
            started = time.monotonic()
            try:
                status = post(url, deliveries.signed(f"probe-{sent}"), timeout_s=10)
            except OSError:  # urllib's timeout and connection errors
                timeouts += 1
                continue
            latencies.append((time.monotonic() - started) * 1e3)
            if status in (200, 202):
                accepted += 1
            else:
                other += 1
            time.sleep(args.probe_interval)
        lifetimes = list(slow.lifetimes)
    return Probe(count, sent, accepted, other, timeouts, latencies, lifetimes)


def print_table(results: list[Result]) -> None:
    print()
    print(
        "| server | connections | requests | req/s | p50 | p90 | p99 | max | non-2xx "
        "| socket errors | CPU server / wrk / Redis |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.server} | {r.connections} | {r.requests} | {r.rps:.0f} | {r.p50_ms:.1f} ms "
            f"| {r.p90_ms:.1f} ms | {r.p99_ms:.1f} ms | {r.max_ms:.1f} ms | {r.other} "
            f"| {r.socket_errors} | {r.cpu} |"
        )
    print()
    for r in results:
        print(f"{r.server} c={r.connections}: {r.check}")
    by = {(r.server, r.connections): r for r in results}
    print()
    for c in sorted({r.connections for r in results}):
        g, p = by.get(("gpuci", c)), by.get(("Probot", c))
        if g and p:
            print(
                f"c={c}: gpuci / Probot throughput {g.rps / p.rps:.2f}; "
                f"gpuci p99 {g.p99_ms:.1f} ms, Probot p99 {p.p99_ms:.1f} ms"
            )
    g16, p16 = by.get(("gpuci", 16)), by.get(("Probot", 16))
    if g16 and p16:
        print(
            f"targets at 16 connections: throughput >= Probot's: "
            f"{'met' if g16.rps >= p16.rps else 'NOT met'} ({g16.rps / p16.rps:.2f}x); "
            f"p99 < 25 ms: {'met' if g16.p99_ms < 25 else 'NOT met'} ({g16.p99_ms:.1f} ms)"
        )


def default_probot_bin() -> str:
    for candidate in (
        os.environ.get("PROBOT_BIN", ""),
        str(PROBOT_DIR / "node_modules" / ".bin" / "probot"),
        "/tmp/gpuci-probot/node_modules/.bin/probot",
    ):
        if candidate and Path(candidate).exists():
            return candidate
    return ""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT (also when inherited as ignored) and SIGTERM end the bench through the
    `finally` that stops the servers; wrk, run by `subprocess.run`, is killed by it."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (10)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="seconds of unmeasured load first (2)"
    )
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (1: 2 cores)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (Procfile: 2)")
    parser.add_argument(
        "--worker-class", default=WORKER_CLASS, help=f"gunicorn worker class ({WORKER_CLASS})"
    )
    parser.add_argument("--threads", type=int, default=4, help="threads per gthread worker")
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="gpuci with an access log (to a file), as deploy/systemd/gpuci-web.service runs",
    )
    parser.add_argument("--redis-url", default=DEFAULT_REDIS, help="flushed! (database 6)")
    parser.add_argument(
        "--bodies",
        type=int,
        help="distinct signed bodies per wrk run (default 12,000 a second of the longer run)",
    )
    parser.add_argument("--probot-bin", default=default_probot_bin(), help="probot executable")
    parser.add_argument("--only", choices=["gpuci", "probot"], help="run one server only")
    parser.add_argument(
        "--slowloris",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: a prober's deliveries while N slow connections trickle headers",
    )
    parser.add_argument("--trickle", type=float, default=5.0, help="s between slow lines (5)")
    parser.add_argument("--slow-duration", type=float, default=20.0, help="s of probing (20)")
    parser.add_argument(
        "--probe-interval", type=float, default=0.05, help="s between deliveries (0.05)"
    )
    args = parser.parse_args()
    if not shutil.which("wrk") and not args.slowloris:
        sys.exit("wrk not found (apt-get install -y wrk)")
    if args.only != "gpuci" and not args.probot_bin:
        sys.exit(
            "probot not found: npm install --prefix /tmp/gpuci-probot probot@14 "
            "(or set PROBOT_BIN / --probot-bin); never install into the repository"
        )
    body = payload_body()
    deliveries = Deliveries.of(body)
    args.bodies = args.bodies or 12_000 * max(args.duration, args.warmup)
    print(
        f"payload: {EVENT} opened, {len(deliveries.signed('0')[0])} bytes and more (one of "
        f"{args.bodies} bodies a request); wrk -t{args.wrk_threads}, {args.duration} s per run"
    )
    print(
        f"gpuci: gunicorn --workers {args.workers} --worker-class {args.worker_class} "
        f"{'--access-logfile FILE ' if args.access_log else ''}'app:create_app()', "
        f"Redis {args.redis_url}; Probot: {args.probot_bin} run ./index.js"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average before the bench: {load} on {os.cpu_count()} CPUs (want it near 0)")
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="gpuci-webhook-bench-") as tmpdir, interruptible():
        tmp = Path(tmpdir)
        results: list[Result] = []
        try:
            files = [] if args.slowloris else deliveries.wrk_files(tmp, args.bodies)
            if args.only != "probot":
                results += bench_gpuci(args, procs, tmp, deliveries, files)
            if args.only != "gpuci":
                results += bench_probot(args, procs, tmp, deliveries, files)
        except KeyboardInterrupt:
            print("interrupted; stopping servers", file=sys.stderr)
        finally:
            procs.stop_all()
            if args.only != "probot":
                with contextlib.suppress(Exception):
                    Redis.from_url(args.redis_url).flushdb()
        if results:
            print_table(results)


if __name__ == "__main__":
    main()
