"""Benchmark: the test history's cost in the report step, against that step without it (judge
alone): recording a run of 10,000 tests, and classifying a run with 1,000 failures, in Redis
round trips and milliseconds."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from redis import Redis

from bot import classify, history
from bot.classify import Policy
from bot.runs import Run, RunState, RunTrigger
from contract.checks import judge
from contract.outcomes import TestOutcome
from contract.results import Failure, RunReport, Summary

REPO = "bench/history"
BATCH = "unit"
TESTS = 10_000
FAILURES = 1_000
BASELINE_RUNS = 20


class CountingRedis(Redis):
    """Counts what reaches the server: one round trip per command, per pipeline."""

    round_trips = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        CountingRedis.round_trips += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def counted(raise_on_error: bool = True) -> Any:
            CountingRedis.round_trips += 1
            return execute(raise_on_error)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe


def a_run(run_id: int, pr: int = 0) -> Run:
    return Run(
        run_id=str(run_id), repo=REPO, installation_id=1, pr=pr, sha=f"{run_id:040x}",
        batch=BATCH, trigger=RunTrigger.SCHEDULE, requested_by="bench", state=RunState.RUNNING,
        created_at=0.0, updated_at=0.0, host="bench-h1",
    )  # fmt: skip


def a_report(rng: random.Random, failures: int) -> RunReport:
    """TESTS tests, `failures` of them failing, a few skipped, durations spread out."""
    failing = set(rng.sample(range(TESTS), failures))
    tests = [
        TestOutcome(
            f"tests/unit/test_mod{i // 100:03d}.py::TestCase::test_case_{i:05d}[param]",
            "f" if i in failing else ("s" if i % 97 == 0 else "p"),
            rng.expovariate(20),
            reason="needs 2 GPUs" if i % 97 == 0 and i not in failing else "",
        )
        for i in range(TESTS)
    ]
    bad = [t for t in tests if t.outcome == "f"]
    summary = Summary(
        tests=TESTS, passed=sum(t.outcome == "p" for t in tests), failed=len(bad),
        skipped=sum(t.outcome == "s" for t in tests),
        failures=[Failure(t.test_id, "failure", "boom", "assert 0", "tests/x.py", 3) for t in bad],
        slowest=[(t.test_id, t.seconds) for t in sorted(tests, key=lambda t: -t.seconds)[:10]],
    )  # fmt: skip
    return RunReport(summary=summary, tests=tests)


def timed(action: Callable[[], object], repeats: int) -> tuple[float, int]:
    """Median milliseconds of `action`, and its round trips (last repeat)."""
    times = []
    for _ in range(repeats):
        before = CountingRedis.round_trips
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
        trips = CountingRedis.round_trips - before
    return statistics.median(times), trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    conn = CountingRedis.from_url(args.redis_url)
    conn.flushdb()
    rng = random.Random(15)
    policy, bounds = Policy(), history.Bounds()
    try:
        for n in range(1, BASELINE_RUNS + 1):  # the default branch's baseline, 20 runs
            report = a_report(rng, 50)
            verdict = judge(report, batch=BATCH, allow_no_tests=False, sha="0" * 40, host="h")
            history.judge_with_history(
                conn, a_run(n), report, verdict, mode="strict", policy=policy, bounds=bounds
            )
        report = a_report(rng, FAILURES)
        run_ids = iter(range(1000, 10**6))

        def judge_only() -> object:
            return judge(report, batch=BATCH, allow_no_tests=False, sha="1" * 40, host="h")

        verdict = judge_only()

        def with_history() -> object:
            return history.judge_with_history(
                conn, a_run(next(run_ids), pr=1), report, verdict, mode="strict",
                policy=policy, bounds=bounds,
            )  # fmt: skip

        judge_ms, _ = timed(judge_only, args.repeats)
        history_ms, trips = timed(with_history, args.repeats)
        print(f"run of {TESTS} tests, {FAILURES} failing, against {BASELINE_RUNS} baseline runs")
        print(f"  the report step without history (judge): {judge_ms:6.1f} ms")
        print(f"  with history (number, read baseline, classify, record): {history_ms:6.1f} ms in"
              f" {trips} Redis round trips ({history_ms / judge_ms:.1f}x judge)")  # fmt: skip
        numbering_bench(report, args.repeats)
        record_bench(conn, report, args.repeats)
        classify_bench(conn, report, policy, args.repeats)
    finally:
        conn.flushdb()


def numbering_bench(report: RunReport, repeats: int) -> None:
    """Test ids to numbers: BLAKE2b on first sight, then the process's cache."""
    ids = [t.test_id for t in report.tests]
    cold_ms, _ = timed(lambda: [history.test_number.__wrapped__(t) for t in ids], repeats)
    warm_ms, _ = timed(lambda: history.test_numbers(ids), repeats)
    print(f"numbering {len(ids)} test ids: {cold_ms:6.1f} ms uncached, {warm_ms:6.1f} ms cached")


def record_bench(conn: Redis, report: RunReport, repeats: int) -> None:
    """Recording alone: the tests numbered, the record encoded and written within its bound."""
    run_ids = iter(range(10**6, 2 * 10**6))
    tests = report.tests

    def record() -> None:
        numbers = history.test_numbers([t.test_id for t in tests])
        run = a_run(next(run_ids))  # a default-branch run: its failing streaks move too
        history.record(conn, run, report, numbers, tests, {}, history.Bounds())

    record_ms, trips = timed(record, repeats)
    print(f"recording {len(tests)} tests: {record_ms:6.1f} ms in {trips} Redis round trips")


def classify_bench(conn: Redis, report: RunReport, policy: Policy, repeats: int) -> None:
    """The pure classification alone (baseline already read), and the baseline read."""
    numbers = history.test_numbers([t.test_id for t in report.tests])
    wanted = {n for n, t in zip(numbers, report.tests, strict=True) if t.outcome in "fesX"}
    baseline, since = history.read_baseline(conn, REPO, BATCH, policy.flaky_window, wanted)
    this = history.this_run(dict(zip(numbers, report.tests, strict=True)), report)
    names = dict(zip(numbers, (t.test_id for t in report.tests), strict=True))
    read_ms, _ = timed(
        lambda: history.read_baseline(conn, REPO, BATCH, policy.flaky_window, wanted), repeats
    )
    pure_ms, _ = timed(lambda: classify.classify(this, baseline, since, policy), repeats)
    found = classify.classify(this, baseline, since, policy)
    render_ms, _ = timed(lambda: classify.history_section(found, names), repeats)
    total = read_ms + pure_ms + render_ms
    print(f"classifying {len(this.failed)} failures against {len(baseline)} runs: {total:6.1f} ms")
    print(f"  baseline read and decoded: {read_ms:6.1f} ms (one Redis round trip)")
    print(f"  classify (pure): {pure_ms:6.1f} ms; its Check Run section: {render_ms:6.1f} ms")


if __name__ == "__main__":
    main()
