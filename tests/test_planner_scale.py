"""The fleet-scale planner decides exactly as the one it replaced (tests/planner_reference.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from bot.planner import Assignment, HostGpuSlot, HostView, PendingRun, Plan, Priority, plan
from contract.config import Batch, HostGpu
from tests import planner_reference
from tests.test_planner import CASES, NOW, _hosts, _runs

MIN = 60.0
MODELS = [
    HostGpu("NVIDIA H20", 98304, (9, 0)),
    HostGpu("NVIDIA A100-SXM4-80GB", 81920, (8, 0)),
    HostGpu("Tesla T4", 15360, (7, 5)),
    HostGpu("NVIDIA H200", 143771, (9, 0)),
]
CONSTRAINTS = [
    {},
    {},
    {"gpu_model": "H20"},
    {"gpu_model": "A100"},
    {"min_memory_mb": 90000},
    {"min_compute_capability": (8, 0)},
    {"gpu_model": "H200", "min_compute_capability": (9, 0)},
]
RUNTIMES = ["base:default", "base:default", "base:cu12", "image:ghcr.io/org/img"]


def _random_host(rng: random.Random, number: int) -> HostView:
    """A host of one or two GPU models, some GPUs ours with known ends, some foreign."""
    size = rng.choice([1, 2, 4, 8, 8, 8])
    first, second = rng.choice(MODELS), rng.choice(MODELS)
    gpus = [first if rng.random() < 0.8 or i < size // 2 else second for i in range(size)]
    idle, busy_until = set(), {}
    for i in range(size):
        state = rng.random()
        if state < 0.45:
            idle.add(i)
        elif state < 0.9:
            busy_until[i] = NOW + rng.choice([-5, 0, 3, 10, 10, 45, 240]) * MIN
        elif state < 0.95:
            busy_until[i] = None  # a foreign process
    provides = {"base:default"} | set(rng.sample(RUNTIMES, rng.randint(0, 2)))
    return HostView(
        name=f"h{rng.choice(['', '0', 'x-'])}{number}",
        gpus=tuple(HostGpuSlot(i, gpu) for i, gpu in enumerate(gpus)),
        idle=frozenset(idle),
        busy_until=busy_until,
        alive=rng.random() < 0.9,
        free_slots=rng.choice([None, None, 0, 1, 2, 3]),
        provides=frozenset(provides),
        refusing="disk full" if rng.random() < 0.05 else "",
    )


def _random_run(rng: random.Random, number: int) -> PendingRun:
    """Runs of a few batches (shapes repeat, as in a real queue), enqueued in a few waves."""
    kind = rng.randrange(12)
    needs = RUNTIMES[kind % len(RUNTIMES)] if rng.random() < 0.3 else "base:default"
    batch = Batch(
        name=f"b{kind}",
        gpus=[0, 1, 1, 2, 4, 8, 3, 1, 2, 8, 16, 1][kind],
        tests=(),
        **CONSTRAINTS[kind % len(CONSTRAINTS)],  # type: ignore[arg-type]
    )
    return PendingRun(
        run_id=f"r{number}",
        batch=batch,
        priority=rng.choice(list(Priority)),
        enqueued_at=NOW - rng.randint(0, 4) * MIN,
        expected_s=rng.choice([30, 120, 600, 600, 3600, 4 * 3600]),
        needs=needs,
        runtime=needs.rpartition(":")[2],
    )


def _assert_same(pending: list[PendingRun], hosts: list[HostView], now: float) -> Plan:
    expected = planner_reference.plan(pending, hosts, now)
    decided = plan(pending, hosts, now)
    assert decided.assignments == expected.assignments
    assert decided.reservation == expected.reservation
    assert decided.unrunnable == expected.unrunnable
    assert list(decided.waiting.items()) == list(expected.waiting.items())
    return decided


@pytest.mark.parametrize(("hosts", "pending", "expected"), CASES)
def test_same_decisions_on_every_planner_case(
    hosts: list[HostView], pending: list[PendingRun], expected: dict[str, str]
) -> None:
    _assert_same(pending, hosts, NOW)


@pytest.mark.parametrize("seed", range(300))
def test_same_decisions_on_random_fleets(seed: int) -> None:
    rng = random.Random(seed)
    hosts = [_random_host(rng, n) for n in range(rng.randint(0, 30))]
    pending = [_random_run(rng, n) for n in range(rng.randint(0, 120))]
    decided = _assert_same(pending, hosts, NOW)
    assert len(decided.assignments) + len(decided.waiting) + len(decided.unrunnable) == len(pending)


def test_random_fleets_exercise_every_kind_of_decision() -> None:
    """The comparison above is worth something only if the fleets reach every branch."""
    seen: set[str] = set()
    for seed in range(300):
        rng = random.Random(seed)
        hosts = [_random_host(rng, n) for n in range(rng.randint(0, 30))]
        decided = plan([_random_run(rng, n) for n in range(rng.randint(0, 120))], hosts, NOW)
        seen |= {"assigned"} if decided.assignments else set()
        seen |= {"reserved"} if decided.reservation else set()
        seen |= {"unrunnable"} if decided.unrunnable else set()
        for wait in decided.waiting.values():
            words = ["held back", "reserved for it", "largest idle", "none is idle", "runtime"]
            seen |= {w for w in [*words, "not alive", "takes no runs"] if w in wait.reason}
    assert seen == {
        "assigned", "reserved", "unrunnable", "held back", "reserved for it", "largest idle",
        "none is idle", "runtime", "not alive", "takes no runs",
    }  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_hosts(), _runs())
def test_same_decisions_on_drawn_situations(
    hosts: list[HostView], pending: list[PendingRun]
) -> None:
    _assert_same(pending, hosts, NOW)


def test_same_decisions_round_after_round() -> None:
    """A stream of rounds where each one's assignments take GPUs for the next."""
    rng = random.Random(16)
    hosts = [_random_host(rng, n) for n in range(12)]
    hosts = [HostView(h.name, h.gpus, h.idle, h.busy_until, alive=True) for h in hosts]
    pending = [_random_run(rng, n) for n in range(200)]
    now, started_in_all = NOW, 0
    for _ in range(25):
        decided = _assert_same(pending, hosts, now)
        started = {a.run_id: a for a in decided.assignments}
        started_in_all += len(started)
        expected = {r.run_id: r.expected_s for r in pending}
        hosts = [_after(h, list(started.values()), expected, now) for h in hosts]
        pending = [r for r in pending if r.run_id in decided.waiting]
        now += 5 * MIN
        hosts = [_finish(h, now) for h in hosts]
    assert started_in_all > 50  # the rounds did move GPUs from run to run


def _after(
    host: HostView, started: list[Assignment], expected: dict[str, float], now: float
) -> HostView:
    taken = {
        i: now + expected[a.run_id] for a in started if a.host == host.name for i in a.gpu_indices
    }
    return HostView(
        host.name, host.gpus, host.idle - set(taken), {**host.busy_until, **taken}, host.alive
    )


def _finish(host: HostView, now: float) -> HostView:
    ended = {i for i, end in host.busy_until.items() if end is not None and end <= now}
    busy = {i: end for i, end in host.busy_until.items() if i not in ended}
    return HostView(host.name, host.gpus, host.idle | ended, busy, host.alive)
