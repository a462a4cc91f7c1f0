"""Asking the events worker to bring a run's Check Run up to date (bot/reports.py does it)."""

from __future__ import annotations

from collections.abc import Iterable

from redis import Redis
from rq import Queue, Retry

REPORTS_QUEUE = "gpuci-reports"
REPORT_JOB = "bot.reports.report_run"
REPORT_RETRY_S = [5, 30, 60, 300, 900, 1800]


def report(conn: Redis, run_id: str) -> None:
    """A report job for the run; one that fails (GitHub down) is retried for about an hour,
    and the run's state and result are already safe in Redis."""
    Queue(REPORTS_QUEUE, connection=conn).enqueue(
        REPORT_JOB, run_id, job_timeout=120, retry=Retry(max=6, interval=REPORT_RETRY_S)
    )


def report_many(conn: Redis, run_ids: Iterable[str]) -> None:
    """`report` for many runs, queued in one round trip."""
    queue = Queue(REPORTS_QUEUE, connection=conn)
    jobs = [
        Queue.prepare_data(
            REPORT_JOB, (run_id,), timeout=120, retry=Retry(max=6, interval=REPORT_RETRY_S)
        )
        for run_id in run_ids
    ]
    if jobs:
        queue.enqueue_many(jobs)
