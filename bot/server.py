"""The web process's HTTP server: a gunicorn worker on asyncio that answers `POST /webhook`
itself and runs the Flask app on threads for every other request.

Run as `gunicorn --worker-class bot.server.Worker 'app:create_app()'` (the Procfile).

Why not gunicorn's sync workers (docs/benchmarks.md, webhook intake): each holds one
connection from its first byte to its last, so two clients trickling headers stopped the
intake, and each delivery paid for a new TCP connection and gunicorn's request parsing. Here:

- a connection costs no worker while it sends, and a request must arrive whole within
  `REQUEST_DEADLINE_S` of the connection being ready for it (GitHub's own limit), else the
  connection is closed (408 if a request had begun); at `worker_connections` the
  connection waiting longest for its request is closed to make room;
- connections are kept alive between requests (for at most that deadline);
- the inbox calls of the deliveries in flight share one Redis round trip
  (`bot.webhooks.AsyncIntake`); the delivery's answer still waits for its own reply.

HTTP/1.1 as this server speaks it: requests framed by Content-Length only (a
Transfer-Encoding is answered 501), at most `MAX_HEAD_BYTES` of request line and headers,
a body over `GPUCI_MAX_BODY_BYTES` refused with 413 before it is read, responses always with
a Content-Length (the Flask app's are read whole first; they are small).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.workers.base import Worker as GunicornWorker

from bot import webhooks

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication, WSGIEnvironment

REQUEST_DEADLINE_S = 10.0  # GitHub gives up on a delivery after 10 s
MAX_HEAD_BYTES = 64 * 1024  # request line and header fields
MAX_HEADER_FIELDS = 100
FLASK_THREADS = 4  # at least; gunicorn's --threads raises it
# gunicorn's default access_log_format (Apache's combined): written by `access_line`.
COMBINED_FORMAT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'

Headers = list[tuple[str, str]]
Response = tuple[int, Headers, bytes]

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # tab is allowed in values
_DIGITS = re.compile(r"[0-9]{1,19}")
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length"})
_JSON = [("Content-Type", "application/json")]


class BadRequest(Exception):
    """A request this server will not read further: answered with `status`, then closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Head:
    """A request's line and header fields: `fields` maps each lower-cased name to its values
    joined by ", " (RFC 9110 5.3)."""

    method: str
    target: str
    version: str
    fields: dict[str, str]

    @property
    def headers(self) -> list[tuple[str, str]]:  # what gunicorn's access log reads
        return list(self.fields.items())

    def get(self, name: str, /) -> str | None:
        return self.fields.get(name.lower())

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def content_length(self) -> int:
        return int(self.fields.get("content-length", "0"))

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.fields.get("connection", "").split(",")}
        return "keep-alive" in tokens if self.version == "HTTP/1.0" else "close" not in tokens

    @property
    def expects_continue(self) -> bool:
        return self.version == "HTTP/1.1" and self.fields.get("expect", "") == "100-continue"


def parse_head(raw: bytes) -> Head:
    """The request line and header fields (without the blank line). BadRequest unless they
    are HTTP/1.x as RFC 9112 writes it: no line folding, no bare CR or LF or other control
    characters, a path as target, no Transfer-Encoding, at most one Content-Length value."""
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or _CONTROL.search(parts[1]):
        raise BadRequest(400, "malformed request line")
    method, target, version = (part.decode("latin-1") for part in parts)
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505, f"{version[:20]} is not supported; speak HTTP/1.1")
    if not target.startswith("/") and not (target == "*" and method == "OPTIONS"):
        raise BadRequest(400, "the request target must be a path")
    if len(lines) > MAX_HEADER_FIELDS + 1:
        raise BadRequest(431, f"more than {MAX_HEADER_FIELDS} header fields")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise BadRequest(400, "malformed header field (or obsolete line folding)")
        value = value.strip(b" \t")
        if _CONTROL.search(value):
            raise BadRequest(400, "control character in a header field")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    if "transfer-encoding" in fields:
        raise BadRequest(501, "Transfer-Encoding is not supported; send a Content-Length")
    if "content-length" in fields:
        lengths = {v.strip() for v in fields["content-length"].split(",")}
        if len(lengths) != 1 or not all(_DIGITS.fullmatch(v) for v in lengths):
            raise BadRequest(400, "invalid Content-Length")
        fields["content-length"] = lengths.pop()
    return Head(method, target, version, fields)


_dated: tuple[int, str] = (0, "")


def http_date() -> str:
    global _dated
    now = int(time.time())
    if _dated[0] != now:
        _dated = (now, formatdate(now, usegmt=True))
    return _dated[1]


_logged: tuple[int, str] = (0, "")


def log_time() -> str:
    """The access log's time atom, as gunicorn's Logger.now writes it."""
    global _logged
    now = int(time.time())
    if _logged[0] != now:
        _logged = (now, time.strftime("[%d/%b/%Y:%H:%M:%S %z]", time.localtime(now)))
    return _logged[1]


def access_line(head: Head, status: int, sent: int, peer: str) -> str:
    """The line gunicorn's Logger.access writes in COMBINED_FORMAT, without the two dozen
    atoms it builds for any format (most of its cost: docs/benchmarks.md). The user is "-":
    the log is given no Authorization."""

    def quoted(text: str) -> str:
        return text.replace('"', '\\"')

    request = quoted(f"{head.method} {head.target} {head.version}")
    referer = quoted(head.get("referer") or "-")
    agent = quoted(head.get("user-agent") or "-")
    return f'{quoted(peer)} - - {log_time()} "{request}" {status} {sent} "{referer}" "{agent}"'


def response_head(status: int, headers: Headers, length: int, close: bool) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {status} {phrase}", f"Date: {http_date()}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {length}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def json_response(answer: webhooks.Answer, extra: Headers | None = None) -> Response:
    return answer[0], _JSON + (extra or []), webhooks.encode_answer(answer)


def call_wsgi(app: WSGIApplication, environ: WSGIEnvironment) -> Response:
    """One request through a WSGI app (on a pool thread): status, headers, the whole body."""
    started: list[Any] = []
    chunks: list[bytes] = []

    def start_response(status: str, headers: Headers, exc_info: Any = None) -> Any:
        if exc_info and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [status, headers]
        return chunks.append

    result = app(environ, start_response)
    try:
        chunks.extend(result)
    finally:
        if hasattr(result, "close"):
            result.close()
    status, headers = started
    return int(status.split(" ", 1)[0]), list(headers), b"".join(chunks)


@dataclass
class Site:
    """What the connections of one worker share."""

    wsgi: WSGIApplication
    intake: webhooks.AsyncIntake | None  # None: /webhook goes to the WSGI app too
    max_body: int
    pool: ThreadPoolExecutor
    max_connections: int = 1000
    keep_alive: bool = True
    url_scheme: Callable[[Head, str], str] = lambda head, peer: "http"
    served: Callable[[Head, Response, float, str], None] = lambda *args: None
    connections: dict[Connection, None] = field(default_factory=dict)  # oldest first


class Connection(asyncio.Protocol):
    """One client connection: each request read whole within the deadline, then answered;
    requests sent ahead wait in the buffer and are answered in order."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.head: Head | None = None  # of the request whose body is arriving
        self.busy = False  # a request is being answered
        self.answering: asyncio.Task[None] | None = None
        self.paused = False
        self.deadline: asyncio.TimerHandle | None = None
        self.peer = ("", "")
        self.local = ("", "")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.peer = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        if len(self.site.connections) >= self.site.max_connections:
            waiting = next((c for c in self.site.connections if not c.busy), None)
            if waiting is not None:
                waiting.too_slow()
        self.site.connections[self] = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._advance()
        elif len(self.buffer) > MAX_HEAD_BYTES + self.site.max_body and self.transport:
            self.transport.pause_reading()  # a client far ahead of its answers waits
            self.paused = True

    def eof_received(self) -> bool:
        return self.busy  # a client that half-closes after its request still gets the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.site.connections.pop(self, None)
        self.transport = None

    def close_if_idle(self) -> None:
        if self.transport is not None and not self.busy and not self.buffer:
            self.transport.close()

    def too_slow(self) -> None:
        """The deadline passed: close, with a 408 for a client that began a request."""
        self.deadline = None
        if self.transport is None:
            return
        if self.buffer.strip() or self.head is not None:
            message = f"the request did not arrive whole within {REQUEST_DEADLINE_S:g} s"
            self._refuse(BadRequest(408, message))
        else:
            self.transport.close()

    def _advance(self) -> None:
        """Start answering the next request if the buffer holds all of it."""
        if self.transport is None or self.busy:
            return
        if self.head is None:
            try:
                self.head = self._take_head()
            except BadRequest as exc:
                self._refuse(exc)
                return
            if self.head is None:
                return
        head = self.head
        length = head.content_length
        if len(self.buffer) < length:
            return
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        self.head = None
        self._disarm()
        self.busy = True
        self.answering = self.loop.create_task(self._answer(head, body, time.monotonic()))

    def _take_head(self) -> Head | None:
        """The next request's head, once it is all in the buffer (None until then)."""
        assert self.transport is not None
        while self.buffer.startswith(b"\r\n"):  # RFC 9112 2.2: empty lines before a request
            del self.buffer[:2]
        end = self.buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise BadRequest(431, f"request line and headers over {MAX_HEAD_BYTES} bytes")
            return None
        head = parse_head(bytes(self.buffer[:end]))
        del self.buffer[: end + 4]
        if head.content_length > self.site.max_body:
            raise BadRequest(*_too_large(self.site.max_body))
        if head.expects_continue and len(self.buffer) < head.content_length:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return head

    async def _answer(self, head: Head, body: bytes, started: float) -> None:
        try:
            if head.path == webhooks.PATH and self.site.intake is not None:
                response = await self._webhook(self.site.intake, head, body)
            else:
                environ = self._environ(head, body)
                response = await self.loop.run_in_executor(
                    self.site.pool, call_wsgi, self.site.wsgi, environ
                )
        except Exception:
            webhooks.log.exception("unexpected error answering %s %s", head.method, head.path)
            response = json_response((500, {"error": "internal error; see the gpuci web log"}))
        self._send(head, response)
        self.site.served(head, response, started, self.peer[0])
        if self.transport is not None and not self.transport.is_closing():
            self.busy = False
            if self.paused:
                self.paused = False
                self.transport.resume_reading()
            self._arm()
            self._advance()

    @staticmethod
    async def _webhook(intake: webhooks.AsyncIntake, head: Head, body: bytes) -> Response:
        if head.method != "POST":
            return json_response(webhooks.NOT_POST, webhooks.NOT_POST_HEADERS)
        return json_response(await intake.receive(body, head))

    def _send(self, head: Head, response: Response) -> None:
        if self.transport is None:
            return
        status, headers, content = response
        close = not (self.site.keep_alive and head.keep_alive)
        length = len(content)
        sent = [(k, v) for k, v in headers if k.lower() not in _NOT_FORWARDED]
        if head.method == "HEAD":  # the length a GET would get, when the app says it
            given = [v for k, v in headers if k.lower() == "content-length"]
            length, content = int(given[0]) if given else length, b""
        self.transport.write(response_head(status, sent, length, close) + content)
        if close:
            self.transport.close()

    def _refuse(self, exc: BadRequest) -> None:
        """Answer a request that will not be read and close the connection."""
        if self.transport is None:
            return
        content = webhooks.encode_answer((exc.status, {"error": exc.message}))
        self.transport.write(response_head(exc.status, _JSON, len(content), True) + content)
        self.transport.close()

    def _environ(self, head: Head, body: bytes) -> dict[str, Any]:
        path, _, query = head.target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": head.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
            "QUERY_STRING": query,
            "RAW_URI": head.target,
            "SERVER_NAME": self.local[0],
            "SERVER_PORT": self.local[1],
            "SERVER_PROTOCOL": head.version,
            "REMOTE_ADDR": self.peer[0],
            "REMOTE_PORT": self.peer[1],
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": self.site.url_scheme(head, self.peer[0]),
            "wsgi.input": io.BytesIO(body),
            "wsgi.input_terminated": True,
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        if "content-length" in head.fields:
            environ["CONTENT_LENGTH"] = head.fields["content-length"]
        for name, value in head.fields.items():
            if name == "content-type":
                environ["CONTENT_TYPE"] = value
            elif name != "content-length" and "_" not in name:  # "_" could pose as "-"
                environ["HTTP_" + name.upper().replace("-", "_")] = value
        return environ

    def _arm(self) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(REQUEST_DEADLINE_S, self.too_slow)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None


def _address(address: Any) -> tuple[str, str]:
    """(host, port) of a TCP address; ("", "") for a Unix socket."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), str(address[1])
    return "", ""


def _too_large(limit: int) -> tuple[int, str]:
    status, fields = webhooks.too_large(limit)
    return status, fields["error"]


def access_environ(head: Head, peer: str) -> dict[str, str]:
    """What gunicorn's Logger.access reads of a WSGI environ, for a custom format."""
    return {
        "REQUEST_METHOD": head.method,
        "RAW_URI": head.target,
        "PATH_INFO": head.path,
        "QUERY_STRING": head.target.partition("?")[2],
        "SERVER_PROTOCOL": head.version,
        "REMOTE_ADDR": peer,
        "HTTP_USER_AGENT": head.get("user-agent") or "-",
        "HTTP_REFERER": head.get("referer") or "-",
    }


class _Served:
    """A response as gunicorn's access log reads it."""

    def __init__(self, status: int, headers: Headers, sent: int) -> None:
        self.status, self.headers, self.sent = str(status), headers, sent


class Worker(GunicornWorker):
    """gunicorn worker: one asyncio loop for every connection (see the module docstring).

    The gunicorn settings it reads: bind (TCP or Unix, with certfile/keyfile for TLS),
    workers, threads (the Flask pool, at least FLASK_THREADS), worker_connections,
    keepalive (0: close after each answer), max_requests, timeout (the heartbeat),
    graceful_timeout, accesslog and access_log_format, forwarded_allow_ips with
    secure_scheme_headers (wsgi.url_scheme)."""

    def init_process(self) -> None:
        self.combined_log = (
            type(self.log) is GunicornLogger and self.cfg.access_log_format == COMBINED_FORMAT
        )
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.stopping = asyncio.Event()
        self.quick = False
        self.accepting: set[asyncio.Task[Any]] = set()
        super().init_process()

    def init_signals(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        self.loop.add_signal_handler(signal.SIGTERM, self.stop)
        for sig in (signal.SIGQUIT, signal.SIGINT):  # gunicorn's quick shutdown
            self.loop.add_signal_handler(sig, self.stop, True)
        self.loop.add_signal_handler(signal.SIGUSR1, self.log.reopen_files)
        self.loop.add_signal_handler(signal.SIGWINCH, lambda: None)

    def stop(self, quick: bool = False) -> None:
        self.alive = False
        self.quick = self.quick or quick
        self.stopping.set()

    def run(self) -> None:
        try:
            self.loop.run_until_complete(self.serve())
        finally:
            self.loop.close()

    def site(self) -> Site:
        """The webhook fast path when the app is gpuci's (`create_app` puts `Intake` in
        front of Flask); any other WSGI app gets every request."""
        found = getattr(self.wsgi, "wsgi_app", None)
        intake = found if isinstance(found, webhooks.Intake) else None
        threads = max(FLASK_THREADS, self.cfg.threads)
        return Site(
            wsgi=self.wsgi,
            intake=webhooks.AsyncIntake.from_settings(intake.settings) if intake else None,
            max_body=intake.settings.max_body_bytes if intake else 25 * 1024 * 1024,
            pool=ThreadPoolExecutor(threads, thread_name_prefix="gpuci-web"),
            max_connections=max(1, self.cfg.worker_connections),
            keep_alive=self.cfg.keepalive > 0,
            url_scheme=self.url_scheme,
            served=self.served,
        )

    async def serve(self) -> None:
        site = self.site()
        tls = None
        if self.cfg.is_ssl:
            from gunicorn.sock import ssl_context

            tls = ssl_context(self.cfg)
        listeners = [s.sock for s in self.sockets]
        for listener in listeners:
            listener.setblocking(False)
            self.loop.add_reader(listener.fileno(), self.accept, listener, site, tls)
        while self.alive and os.getppid() == self.ppid:
            self.notify()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 1.0)
        for listener in listeners:
            self.loop.remove_reader(listener.fileno())
        await self.shut_down(site)

    def accept(self, listener: socket.socket, site: Site, tls: ssl.SSLContext | None) -> None:
        """One connection per wake-up: the workers share the listening socket, and the one
        least busy takes the next connection (asyncio's own server takes a whole burst)."""
        try:
            client, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return  # another worker took it
        except OSError as exc:  # out of file descriptors: wait a little, keep serving
            self.log.error("cannot accept a connection: %s", exc)
            self.loop.remove_reader(listener.fileno())
            self.loop.call_later(
                0.5, self.loop.add_reader, listener.fileno(), self.accept, listener, site, tls
            )
            return
        client.setblocking(False)
        made = self.loop.create_task(
            self.loop.connect_accepted_socket(lambda: Connection(site), client, ssl=tls)
        )
        self.accepting.add(made)
        made.add_done_callback(self._accepted)

    def _accepted(self, made: asyncio.Task[Any]) -> None:
        self.accepting.discard(made)
        if not made.cancelled() and made.exception() is not None:  # a failed TLS handshake
            self.log.debug("connection not set up: %s", made.exception())

    async def shut_down(self, site: Site) -> None:
        """Stop listening, let the requests being answered finish (graceful_timeout; not
        on a quick shutdown)."""
        site.keep_alive = False
        give_up = time.monotonic() + (0 if self.quick else self.cfg.graceful_timeout)
        while site.connections and time.monotonic() < give_up:
            for connection in list(site.connections):
                connection.close_if_idle()
            self.notify()
            await asyncio.sleep(0.05)
        for connection in list(site.connections):
            if connection.transport is not None:
                connection.transport.abort()
        if site.intake is not None:
            await site.intake.close()
        site.pool.shutdown(wait=False, cancel_futures=True)

    def url_scheme(self, head: Head, peer: str) -> str:
        """https when the TLS is ours or a trusted proxy says so (gunicorn's rule)."""
        if self.cfg.is_ssl:
            return "https"
        trusted = self.cfg.forwarded_allow_ips
        if "*" in trusted or peer in trusted:
            for name, value in self.cfg.secure_scheme_headers.items():
                if (head.get(name) or "").lower() == value.lower():
                    return "https"
        return "http"

    def served(self, head: Head, response: Response, started: float, peer: str) -> None:
        """Count the request (max_requests) and write gunicorn's access log line (the
        default format by `access_line`)."""
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.stop()
        if not self.cfg.accesslog:
            return
        status, headers, content = response
        if self.combined_log:
            self.log.access_log.info("%s", access_line(head, status, len(content), peer))
            return
        took = timedelta(seconds=time.monotonic() - started)
        served = _Served(status, headers, len(content))
        self.log.access(served, head, access_environ(head, peer), took)


class _Gunicorn(BaseApplication):
    def __init__(self, load: Callable[[], WSGIApplication], options: dict[str, Any]) -> None:
        self._load, self.options = load, options
        super().__init__()

    def load_config(self) -> None:
        for name, value in self.options.items():
            self.cfg.set(name, value)

    def load(self) -> WSGIApplication:
        return self._load()


def run(load: Callable[[], WSGIApplication], bind: str, workers: int) -> None:
    """Serve the app `load` builds (in each worker) as the Procfile does: gunicorn, this
    module's Worker. Returns when gunicorn stops (SIGTERM, SIGINT)."""
    options = {"bind": bind, "workers": workers, "worker_class": f"{__name__}.Worker"}
    with contextlib.suppress(SystemExit):
        _Gunicorn(load, options).run()
