"""Benchmark: one planning round on synthetic fleets, against the planner it replaced.

Fleets of 8 x H20 hosts, about half the GPUs leased by our runs with known ends, pending runs
of 1/2/4/8-GPU batches at three priorities. Prints one `plan()` call per size (best of a few),
its growth from the size before against the growth in work (pending runs + GPUs), and the old
planner's time and the speed-up where the old one finishes in reasonable time (all sizes with
--reference-all). Decisions are checked to be the same wherever both run.

    .venv/bin/python bench/fleet_plan.py [--reference-all]
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.planner_reference

from bot.planner import HostGpuSlot, HostView, PendingRun, Plan, Priority, plan
from contract.config import Batch, HostGpu
from tests import planner_reference

H20 = HostGpu("NVIDIA H20", 98304, (9, 0))
NOW = 1_717_250_400.0
SIZES = [(1, 15), (10, 100), (100, 1000), (100, 5000), (500, 5000)]
REFERENCE_UP_TO = 100 * 1000  # hosts x runs beyond which the old planner takes many seconds
BATCHES = [
    Batch(name=f"b{gpus}-{n}", gpus=gpus, tests=(), timeout_s=3600)
    for gpus in (1, 2, 4, 8)
    for n in range(3)
]
Planner = Callable[[Sequence[PendingRun], Sequence[HostView], float], Plan]


def fleet(hosts: int, seed: int = 16) -> list[HostView]:
    """`hosts` hosts of 8 H20s; each GPU leased with an end in 1-60 minutes at even odds."""
    rng = random.Random(seed)
    views = []
    for number in range(hosts):
        busy = {i: NOW + rng.randint(1, 60) * 60.0 for i in range(8) if rng.random() < 0.5}
        views.append(
            HostView(
                name=f"h20-{number + 1:03d}",
                gpus=tuple(HostGpuSlot(i, H20) for i in range(8)),
                idle=frozenset(range(8)) - set(busy),
                busy_until=busy,
            )
        )
    return views


def queue(runs: int, seed: int = 16) -> list[PendingRun]:
    """`runs` pending runs of 12 batches, three priorities, enqueued over the last hour."""
    rng = random.Random(seed)
    return [
        PendingRun(
            run_id=f"run-{n}",
            batch=(batch := rng.choice(BATCHES)),
            priority=rng.choice(list(Priority)),
            enqueued_at=NOW - rng.randint(0, 3600),
            expected_s=rng.choice([60, 300, 900, 1800, batch.timeout_s]),
        )
        for n in range(runs)
    ]


def timed(planner: Planner, pending: list[PendingRun], hosts: list[HostView]) -> float:
    """Seconds for one call: the best of as many as fit in about a second (at least one)."""
    best, spent = float("inf"), 0.0
    while spent < 1.0 or best == float("inf"):
        start = time.perf_counter()
        planner(pending, hosts, NOW)
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return best


def same(pending: list[PendingRun], hosts: list[HostView]) -> bool:
    ours, theirs = plan(pending, hosts, NOW), planner_reference.plan(pending, hosts, NOW)
    return ours == theirs


def main() -> None:
    reference_all = "--reference-all" in sys.argv
    print("One planning round (8 x H20 per host, half the GPUs leased, 1/2/4/8-GPU batches)")
    print(f"  {'hosts':>5} {'GPUs':>5} {'pending':>7} {'plan()':>9} {'growth':>14} {'old':>9}")
    before: tuple[float, int] | None = None
    for hosts, runs in SIZES:
        views, pending = fleet(hosts), queue(runs)
        took = timed(plan, pending, views)
        work = runs + 8 * hosts
        growth = f"{took / before[0]:5.1f}x / {work / before[1]:4.1f}x" if before else ""
        old = ""
        if reference_all or hosts * runs <= REFERENCE_UP_TO:
            old_took = timed(planner_reference.plan, pending, views)
            old = f"{old_took * 1000:7.1f} ms = {old_took / took:5.1f}x"
            old += "" if same(pending, views) else "  DECISIONS DIFFER"
        print(f"  {hosts:>5} {8 * hosts:>5} {runs:>7} {took * 1000:6.1f} ms {growth:>14} {old}")
        before = (took, work)
    print("  growth: time / work (pending runs + GPUs) against the size above")


if __name__ == "__main__":
    main()
