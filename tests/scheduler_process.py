"""A scheduler process for tests: the real main loop and leader lock against a Redis URL, with
a fixed source token in place of minting one from GitHub (slow the first time, if asked).

    python -m tests.scheduler_process REDIS_URL HOLDER LOCK_TTL_S SLOW_TOKEN_S
"""

from __future__ import annotations

import logging
import sys
import time

from redis import Redis

from bot.leader import Leadership
from bot.runs import Run
from bot.scheduler import main_loop


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
    main_loop(conn, source_token, "http://127.0.0.1:1", lambda: False, leadership=leadership)


if __name__ == "__main__":
    main()
