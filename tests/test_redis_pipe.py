"""bot/redis_pipe.py, the web server's pipelined Redis connection, against real redis-servers
(the tests' database, one with a password) and a server that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from redis import Redis
from redis import exceptions as redis_errors
from redis.exceptions import RedisError, ResponseError

from bot.redis_local import answers, free_port
from bot.redis_pipe import Incomplete, RedisPipe, encode, parse


def test_replies_come_back_in_order_and_an_error_fails_only_its_command(
    redis_url: str, redis_conn: Redis
) -> None:
    body = b"\x00\r\n" * 10_000  # binary, CRLFs inside, larger than one read

    async def main() -> list[object]:
        pipe = RedisPipe(redis_url)
        replies = [
            pipe.send("SET", "k", body),
            pipe.send("GET", "k"),
            pipe.send("GET", "missing"),
            pipe.send("INCRBY", "n", 41),
            pipe.send("HINCRBY", "k", "f", 1),  # wrong type: an error reply
            pipe.send("RPUSH", "l", "a", "b"),
            pipe.send("LRANGE", "l", 0, -1),
            pipe.send("EVAL", "return {1, 'two', {3}}", 0),
        ]
        results = await asyncio.gather(*replies, return_exceptions=True)
        await pipe.close()
        return results

    ok, got, missing, n, wrong, pushed, listed, nested = asyncio.run(main())
    assert (ok, got, missing, n, pushed, listed) == ("OK", body, None, 41, 2, [b"a", b"b"])
    assert isinstance(wrong, ResponseError) and "WRONGTYPE" in str(wrong)
    assert nested == [1, b"two", [3]]
    assert redis_conn.get("k") == body


def test_every_prefix_of_a_reply_is_incomplete() -> None:
    replies = b"+OK\r\n-ERR no\r\n:7\r\n$3\r\na\r\n\r\n$-1\r\n*2\r\n:1\r\n$1\r\nx\r\n"
    values, pos = [], 0
    while pos < len(replies):
        value, pos = parse(replies, pos)
        values.append(value)
    assert [str(v) if isinstance(v, ResponseError) else v for v in values] == [
        "OK",
        "ERR no",
        7,
        b"a\r\n",
        None,
        [1, b"x"],
    ]
    for end in range(len(replies)):
        chunk, at = replies[:end], 0
        with contextlib.suppress(Incomplete):
            while True:
                _, at = parse(chunk, at)
        assert at <= end
    with pytest.raises(ValueError):
        parse(b"?what\r\n")
    assert encode("SET", "k", 1, b"v") == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n$1\r\nv\r\n"


@contextlib.contextmanager
def redis_with_password(password: str) -> Iterator[int]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    options = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [binary, *options, "--requirepass", password],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not answers(f"redis://:{password}@127.0.0.1:{port}/0"):
            assert proc.poll() is None and time.monotonic() < deadline, "no redis-server"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_urls_password_and_database_are_used() -> None:
    with redis_with_password("s3cret") as port:

        async def main(url: str) -> object:
            pipe = RedisPipe(url)
            try:
                return await pipe.send("SET", "where", "db 3")
            except RedisError as exc:
                return exc
            finally:
                await pipe.close()

        assert asyncio.run(main(f"redis://:s3cret@127.0.0.1:{port}/3")) == "OK"
        assert Redis(port=port, password="s3cret", db=3).get("where") == b"db 3"
        refused = asyncio.run(main(f"redis://:wrong@127.0.0.1:{port}/3"))
        assert isinstance(refused, ResponseError)


def test_an_unreachable_redis_fails_fast_with_a_connection_error() -> None:
    async def main() -> tuple[object, float]:
        pipe = RedisPipe(f"redis://127.0.0.1:{free_port()}/0")
        started = time.monotonic()
        result = await asyncio.gather(pipe.send("PING"), return_exceptions=True)
        return result[0], time.monotonic() - started

    error, took = asyncio.run(main())
    assert isinstance(error, redis_errors.ConnectionError)
    assert took < 1


def test_a_silent_server_times_out_every_waiting_command_then_a_new_connection_is_made() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    async def main() -> tuple[list[object], float, object]:
        pipe = RedisPipe(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", timeout_s=0.5)
        started = time.monotonic()
        first = await asyncio.gather(pipe.send("PING"), pipe.send("PING"), return_exceptions=True)
        took = time.monotonic() - started
        again = await asyncio.gather(pipe.send("PING"), return_exceptions=True)
        await pipe.close()
        return first, took, again[0]

    try:
        first, took, again = asyncio.run(main())
    finally:
        stop.set()
        thread.join()
        listener.close()
        for sock in accepted:
            sock.close()
    assert all(isinstance(e, redis_errors.TimeoutError) for e in first)
    assert 0.4 < took < 2
    assert isinstance(again, redis_errors.TimeoutError)
    assert len(accepted) == 2  # the broken connection was not reused


def test_a_connection_redis_closes_fails_its_commands_and_the_next_one_reconnects(
    redis_url: str, redis_conn: Redis
) -> None:
    async def main() -> tuple[object, object]:
        pipe = RedisPipe(redis_url)
        client_id = await pipe.send("CLIENT", "ID")
        waiting = pipe.send("BLPOP", "nothing", 5)  # a reply that is not coming soon
        await asyncio.sleep(0.2)
        redis_conn.client_kill_filter(_id=str(client_id))
        lost = (await asyncio.gather(waiting, return_exceptions=True))[0]
        again = await pipe.send("PING")
        await pipe.close()
        return lost, again

    lost, again = asyncio.run(main())
    assert isinstance(lost, redis_errors.ConnectionError)
    assert again == "PONG"
