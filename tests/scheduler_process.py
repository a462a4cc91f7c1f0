"""A scheduler process for tests: the real main loop and leader lock against a Redis URL, with
a fixed source token in place of minting one from GitHub (slow the first time, if asked).

    python -m tests.scheduler_process REDIS_URL HOLDER LOCK_TTL_S SLOW_TOKEN_S

It stops, as on SIGTERM, once its stdin closes: the test that started it holds the other end,
so a test session killed before its teardown (SIGKILL, OOM, a CI job cancelled) leaves no
scheduler behind to lead, and dispatch, in the database the next session claims.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from redis import Redis

from bot.leader import Leadership
from bot.runs import Run
from bot.scheduler import main_loop, stop_on_sigterm


def main() -> None:
    url, holder, ttl_s, slow_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
    conn = Redis.from_url(url)
    minted: list[str] = []

    def source_token(run: Run) -> str:
        if slow_s and not minted:
            time.sleep(slow_s)  # GitHub slow to answer: the round outlives the lock
        minted.append(run.run_id)
        return f"token-for-{run.run_id}"

    leadership = Leadership(conn, holder, ttl_s)
    terminated, orphaned = stop_on_sigterm(), stop_with_parent()
    main_loop(
        conn,
        source_token,
        "http://127.0.0.1:1",
        lambda: terminated() or orphaned(),
        leadership=leadership,
    )


def stop_with_parent() -> Callable[[], bool]:
    """A `stop` set when stdin reaches its end: the parent closed it, or died."""
    gone = threading.Event()

    def watch() -> None:
        while os.read(sys.stdin.fileno(), 4096):  # the raw fd: a daemon thread blocked in
            pass  # sys.stdin's buffered reader aborts the interpreter's exit (its lock)
        logging.getLogger(__name__).info("stdin closed: the test that started us is gone")
        gone.set()

    threading.Thread(target=watch, daemon=True).start()
    return gone.is_set


if __name__ == "__main__":
    main()
