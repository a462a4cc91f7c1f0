"""One pipelined Redis connection on asyncio: the web server's calls for the webhook intake.

redis-py's asyncio client spends more on packing, pooling and parsing a 21 KB delivery than
the server spends on the rest of it (docs/benchmarks.md). Here a command is encoded once, the
commands sent in one turn of the loop go out in one write, and replies are matched to
commands in order. A reply that has not come `timeout_s` after its command, or a lost
connection, fails every command waiting (redis.exceptions.TimeoutError / ConnectionError, so
callers catch RedisError); the next command connects again. Nothing is retried: the caller
answers 503 and GitHub's delivery is replayed later (bot/redeliver.py).

It reads the replies of the commands gpuci sends: simple strings, errors, integers, bulk
strings and arrays of them. URLs: redis://, rediss:// (certificate checked; `ssl_ca_certs`
honoured) and unix://, with user, password and database as redis-py reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import Any

from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Reply = Any  # str | int | bytes | None | list[Reply] | ResponseError


def encode(*args: str | int | bytes) -> bytes:
    """A command in RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


class Incomplete(Exception):
    """The buffer ends inside a reply."""


def parse(buf: bytearray | bytes, pos: int = 0) -> tuple[Reply, int]:
    """One reply starting at `pos`: (value, position after it). Raises Incomplete, or
    ValueError for bytes that are no RESP reply."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind, line, after = buf[pos : pos + 1], bytes(buf[pos + 1 : end]), end + 2
    if kind == b"+":
        return line.decode(), after
    if kind == b"-":
        return ResponseError(line.decode(errors="replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        size = int(line)
        if size < 0:
            return None, after
        if len(buf) < after + size + 2:
            raise Incomplete
        return bytes(buf[after : after + size]), after + size + 2
    if kind == b"*":
        count, items = int(line), []
        for _ in range(max(count, 0)):
            item, after = parse(buf, after)
            items.append(item)
        return (items if count >= 0 else None), after
    raise ValueError(f"not a RESP reply: {bytes(buf[pos : pos + 20])!r}")


class RedisPipe:
    """Send commands, get each reply on a future (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.options = parse_url(url)
        self.tls = url.startswith("rediss://")
        self.timeout_s = timeout_s
        self._link: _Link | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._waiting: list[tuple[bytes, asyncio.Future[Reply]]] = []  # while connecting

    def send(self, *args: str | int | bytes) -> asyncio.Future[Reply]:
        """The command's reply, or its RedisError, on a future. A ResponseError (an error
        reply) is raised when the future is awaited, like the others."""
        reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        command = encode(*args)
        if self._link is not None:
            self._link.write(command, reply)
        else:
            self._waiting.append((command, reply))
            if self._connecting is None:
                self._connecting = asyncio.get_running_loop().create_task(self._connect())
        return reply

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        waiting, self._waiting = self._waiting, []
        for _, reply in waiting:
            _fail(reply, RedisConnectionError("the web process is stopping"))
        if self._link is not None:
            self._link.transport.close()
            self._link = None

    def _lost(self, link: _Link) -> None:
        if self._link is link:
            self._link = None

    async def _connect(self) -> None:
        try:
            link = await asyncio.wait_for(self._open(), self.timeout_s)
        except (OSError, TimeoutError) as exc:
            waiting, self._waiting = self._waiting, []
            for _, reply in waiting:
                _fail(reply, RedisConnectionError(f"cannot reach Redis: {str(exc) or 'timed out'}"))
            return
        finally:
            self._connecting = None
        for command in self._handshake():
            link.write(command, None)
        waiting, self._waiting = self._waiting, []
        for command, reply in waiting:
            link.write(command, reply)
        self._link = link

    async def _open(self) -> _Link:
        loop = asyncio.get_running_loop()
        options = self.options
        made: tuple[asyncio.BaseTransport, _Link]
        if "path" in options:
            made = await loop.create_unix_connection(lambda: _Link(self), options["path"])
        else:
            host, port = options.get("host", "localhost"), options.get("port", 6379)
            made = await loop.create_connection(lambda: _Link(self), host, port, ssl=self._tls())
        return made[1]

    def _tls(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        return ssl.create_default_context(cafile=self.options.get("ssl_ca_certs"))

    def _handshake(self) -> list[bytes]:
        options, commands = self.options, []
        if options.get("password"):
            user = [options["username"]] if options.get("username") else []
            commands.append(encode("AUTH", *user, options["password"]))
        if options.get("db"):
            commands.append(encode("SELECT", int(options["db"])))
        return commands


class _Link(asyncio.Protocol):
    """One TCP or Unix connection of a RedisPipe."""

    def __init__(self, pipe: RedisPipe) -> None:
        self.pipe = pipe
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport
        self.pending: deque[tuple[float, asyncio.Future[Reply] | None]] = deque()
        self.out: list[bytes] = []
        self.buffer = bytearray()
        self.watch: asyncio.TimerHandle | None = None
        self.broken: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def write(self, command: bytes, reply: asyncio.Future[Reply] | None) -> None:
        """Queue a command; the commands of this loop turn are written together."""
        if self.broken is not None:
            if reply is not None:
                _fail(reply, self.broken)
            return
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out.append(command)
        self.pending.append((self.loop.time() + self.pipe.timeout_s, reply))
        if self.watch is None:
            self.watch = self.loop.call_at(self.pending[0][0], self._check)

    def _flush(self) -> None:
        if self.out and self.broken is None:
            self.transport.write(b"".join(self.out))
        self.out = []

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        pos = 0
        try:
            while pos < len(self.buffer) and self.pending:
                value, pos = parse(self.buffer, pos)
                _, reply = self.pending.popleft()
                if reply is not None and not reply.done():
                    if isinstance(value, ResponseError):
                        reply.set_exception(value)
                    else:
                        reply.set_result(value)
        except Incomplete:
            pass
        except ValueError as exc:
            self._break(RedisConnectionError(f"unreadable reply from Redis: {exc}"))
            return
        del self.buffer[:pos]

    def _check(self) -> None:
        self.watch = None
        if not self.pending or self.broken is not None:
            return
        due = self.pending[0][0]
        if self.loop.time() >= due:
            self._break(RedisTimeoutError(f"no reply from Redis within {self.pipe.timeout_s:g} s"))
        else:
            self.watch = self.loop.call_at(due, self._check)

    def connection_lost(self, exc: Exception | None) -> None:
        self._break(
            RedisConnectionError(f"lost the connection to Redis: {exc or 'closed by Redis'}")
        )

    def _break(self, error: Exception) -> None:
        """Fail every command waiting; the pipe connects again for the next one."""
        if self.broken is None:
            self.broken = error
            self.pipe._lost(self)
            self.transport.abort()
        while self.pending:
            _, reply = self.pending.popleft()
            if reply is not None:
                _fail(reply, error)
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None


def _fail(reply: asyncio.Future[Reply], error: Exception) -> None:
    if not reply.done():
        reply.set_exception(error)
