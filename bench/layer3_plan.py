"""Benchmark: the planner, simulated on one 8-GPU host, for a whole Layer 3 and a PR stream."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bot.planner import (
    HostGpuSlot,
    HostView,
    PendingRun,
    Plan,
    Priority,
    plan,
    run_order,
)
from contract.config import Batch, HostGpu

HOST = "h20-01"
H20 = HostGpu("NVIDIA H20", 98304, (9, 0))
MIN = 60.0
# A real project's Layer 3: batch -> (GPUs, minutes).
LAYER3 = {
    "2": (1, 2.5), "3": (1, 5.6), "4a": (1, 1.9), "4b": (1, 5.6), "4c": (1, 5.6),
    "4d": (1, 1.9), "4e": (1, 5.6), "5": (2, 5.6), "6": (4, 3.75), "7": (4, 2.8),
    "8": (4, 15), "9": (4, 7.5), "9q": (4, 15), "10": (8, 29), "11": (2, 9.4),
}  # fmt: skip
Planner = Callable[[Sequence[PendingRun], Sequence[HostView], float], Plan]


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds
    run: PendingRun


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    gpus: tuple[int, ...]


def pending(name: str, gpus: int, minutes: float, priority: int, at: float) -> PendingRun:
    """A run whose expected duration is exactly how long it will take."""
    batch = Batch(name=name, gpus=gpus, tests=())
    return PendingRun(name, batch, priority, at, minutes * MIN)


def simulate(
    arrivals: Sequence[Arrival], planner: Planner = plan, gpus: int = 8
) -> dict[str, Span]:
    """Run id -> when it ran: call the planner at every arrival and every completion."""
    future = sorted(arrivals, key=lambda a: a.at)
    queue: dict[str, PendingRun] = {}
    running: dict[str, Span] = {}
    done: dict[str, Span] = {}
    events = [a.at for a in future]
    heapq.heapify(events)
    while events:
        now = heapq.heappop(events)
        queue.update({a.run.run_id: a.run for a in future if a.at <= now})
        future = [a for a in future if a.at > now]
        done.update({r: s for r, s in running.items() if s.end <= now})
        running = {r: s for r, s in running.items() if s.end > now}
        result = planner(list(queue.values()), [_host(running, gpus)], now)
        assert not result.unrunnable, result.unrunnable
        for a in result.assignments:
            running[a.run_id] = Span(now, now + queue.pop(a.run_id).expected_s, a.gpu_indices)
            heapq.heappush(events, running[a.run_id].end)
    assert not queue, f"never started: {sorted(queue)}"
    return done | running


def _host(running: dict[str, Span], gpus: int) -> HostView:
    busy = {i: span.end for span in running.values() for i in span.gpus}
    return HostView(
        name=HOST,
        gpus=tuple(HostGpuSlot(i, H20) for i in range(gpus)),
        idle=frozenset(range(gpus)) - set(busy),
        busy_until=busy,
    )


def first_fit(runs: Sequence[PendingRun], hosts: Sequence[HostView], now: float) -> Plan:
    """The planner without reservations: each run in order starts if it fits, else waits."""
    result = Plan()
    for run in sorted(runs, key=run_order):
        one = plan([run], hosts, now)
        result.assignments += one.assignments
        result.waiting |= one.waiting
        for a in one.assignments:
            hosts = [replace(h, idle=h.idle - set(a.gpu_indices)) for h in hosts]
    return result


def layer3(fifo: bool = False) -> list[Arrival]:
    """The whole layer at t=0; `fifo` enqueues it one batch after another in name order."""
    names = list(LAYER3)
    at = [i * 1e-3 if fifo else 0.0 for i in range(len(names))]
    return [
        Arrival(0.0, pending(name, *LAYER3[name], Priority.SCHEDULED, t))
        for name, t in zip(names, at, strict=True)
    ]


def pr_stream(minutes: int = 90) -> list[Arrival]:
    """Six 1-GPU PR runs at t=0, an 8-GPU PR run at 0.5 min, then a 1-GPU PR run each minute."""
    durations = (2.5, 5.6, 1.9, 5.6, 3.75)
    first = [
        Arrival(0.0, pending(f"pr-{i}", 1, durations[i % 5], Priority.PULL_REQUEST, 0.0))
        for i in range(6)
    ]
    big = Arrival(0.5 * MIN, pending("big-10", 8, 29, Priority.PULL_REQUEST, 0.5 * MIN))
    stream = [
        Arrival(
            m * MIN, pending(f"pr-{m + 5}", 1, durations[m % 5], Priority.PULL_REQUEST, m * MIN)
        )
        for m in range(1, minutes + 1)
    ]
    return [*first, big, *stream]


def makespan(spans: dict[str, Span]) -> float:
    return max(s.end for s in spans.values()) / MIN


def report_layer3() -> None:
    gpu_minutes = sum(g * m for g, m in LAYER3.values())
    bound = max(max(m for _, m in LAYER3.values()), gpu_minutes / 8)
    serial = sum(m for _, m in LAYER3.values())
    print(f"Layer 3 on one 8-GPU host: lower bound {bound:.1f} min, one at a time {serial:.1f} min")
    for label, arrivals in (("planner (LPT ties)", layer3()), ("FIFO by name", layer3(True))):
        spans = simulate(arrivals)
        total = makespan(spans)
        print(
            f"  {label:<19} makespan {total:5.1f} min = {total / bound:.3f}x bound, "
            f"{total / serial:.2f}x one-at-a-time"
        )
    print_schedule(simulate(layer3()))


def print_schedule(spans: dict[str, Span]) -> None:
    for name, s in sorted(spans.items(), key=lambda item: (item[1].start, item[0])):
        gpus = ",".join(map(str, s.gpus))
        print(f"    {name:>4}  {s.start / MIN:5.1f} -> {s.end / MIN:5.1f} min  GPUs {gpus}")


def report_stream() -> None:
    print("PR stream: an 8-GPU run waits while 1-GPU PR runs arrive every minute")
    for label, planner in (("planner (EASY)", plan), ("first fit, no reservation", first_fit)):
        spans = simulate(pr_stream(), planner)
        big = spans["big-10"]
        small = [spans[a.run.run_id].start - a.at for a in pr_stream() if a.run.batch.gpus == 1]
        print(
            f"  {label:<26} 8-GPU run waited {(big.start - 0.5 * MIN) / MIN:5.1f} min; "
            f"1-GPU runs waited {sum(small) / len(small) / MIN:4.1f} min on average, "
            f"{max(small) / MIN:4.1f} at most"
        )


def main() -> None:
    report_layer3()
    report_stream()


if __name__ == "__main__":
    main()
