"""The planner: which pending runs start where, which wait and why, and no starvation."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.planner import (
    Assignment,
    HostGpuSlot,
    HostView,
    PendingRun,
    Plan,
    Priority,
    Reservation,
    Wait,
    plan,
    run_order,
)
from contract.config import Batch, HostGpu, gpu_matches

NOW = datetime(2024, 6, 1, 14, 0, tzinfo=UTC).timestamp()
MIN = 60.0
H20 = HostGpu("NVIDIA H20", 98304, (9, 0))
A100 = HostGpu("NVIDIA A100-SXM4-80GB", 81920, (8, 0))
T4 = HostGpu("Tesla T4", 15360, (7, 5))
PR, COMMAND, SCHEDULED = Priority.PULL_REQUEST, Priority.COMMAND, Priority.SCHEDULED


def host(
    name: str,
    gpus: list[HostGpu] | int = 8,
    busy: dict[int, float | None] | None = None,
    alive: bool = True,
) -> HostView:
    """A host whose GPUs are idle except `busy`: index -> minutes until our run ends, or None
    for a foreign process."""
    models = [H20] * gpus if isinstance(gpus, int) else gpus
    busy = busy or {}
    return HostView(
        name=name,
        gpus=tuple(HostGpuSlot(i, gpu) for i, gpu in enumerate(models)),
        idle=frozenset(i for i in range(len(models)) if i not in busy),
        busy_until={i: None if m is None else NOW + m * MIN for i, m in busy.items()},
        alive=alive,
    )


def run(
    run_id: str,
    gpus: int = 1,
    minutes: float = 10,
    priority: int = PR,
    at: float = 0,
    **constraints: Any,
) -> PendingRun:
    """A pending run of a batch named like the run, enqueued `at` minutes before NOW."""
    batch = Batch(name=run_id, gpus=gpus, tests=(), **constraints)
    return PendingRun(run_id, batch, priority, NOW - 60 * MIN + at * MIN, minutes * MIN)


def outcome(result: Plan) -> dict[str, str]:
    """Each run's fate as one line: `h1:0,1`, `wait: reason`, `unrunnable: reason`."""
    lines = {a.run_id: f"{a.host}:{','.join(map(str, a.gpu_indices))}" for a in result.assignments}
    lines.update({r: f"wait: {w.reason}" for r, w in result.waiting.items()})
    lines.update({r: f"unrunnable: {why}" for r, why in result.unrunnable.items()})
    return lines


def busy_all(
    minutes: float, *, but: tuple[int, ...] = (), gpus: int = 8
) -> dict[int, float | None]:
    return {i: minutes for i in range(gpus) if i not in but}


CASES = [
    pytest.param(
        [host("h1")],
        [run("a"), run("b"), run("c")],
        {"a": "h1:0", "b": "h1:1", "c": "h1:2"},
        id="packs-1-gpu-runs-on-one-host",
    ),
    pytest.param(
        [host("h1"), host("h2", busy=busy_all(30, but=(6, 7)))],
        [run("pair", gpus=2)],
        {"pair": "h2:6,7"},
        id="best-fit-takes-the-host-it-fills",
    ),
    pytest.param(
        [host("h1", 4), host("h2", 5)],
        [run("one", at=0), run("four", gpus=4, at=1)],
        {"one": "h1:0", "four": "h2:0,1,2,3"},
        id="best-fit-keeps-the-big-block-free",
    ),
    pytest.param(
        [host("h20", [H20] * 2), host("a100", [A100] * 4)],
        [run("m", gpu_model="H20")],
        {"m": "h20:0"},
        id="model-constraint",
    ),
    pytest.param(
        [host("h20", [H20] * 2), host("a100", [A100] * 2)],
        [run("mem", min_memory_mb=90 * 1024)],
        {"mem": "h20:0"},
        id="memory-constraint",
    ),
    pytest.param(
        [host("mixed", [T4] * 4 + [A100] * 4)],
        [run("bf16", gpus=2, min_compute_capability=(8, 0)), run("any", at=1)],
        {"bf16": "mixed:4,5", "any": "mixed:0"},
        id="compute-capability-picks-matching-indices",
    ),
    pytest.param(
        [host("mixed", [T4] * 6 + [A100] * 2, busy={6: 20})],
        [run("bf16", gpus=2, min_compute_capability=(8, 0))],
        {
            "bf16": "wait: waiting for 2 idle GPUs with compute capability >= 8.0; "
            "GPUs 6,7 on mixed reserved for it, expected free at 14:20 UTC"
        },
        id="constraint-waits-although-other-gpus-idle",
    ),
    pytest.param(
        [host("h1")],
        [run("big", gpus=16), run("hopper", gpus=2, min_compute_capability=(10, 0))],
        {
            "big": "unrunnable: batch big needs 16 GPUs; the largest host, h1, has 8",
            "hopper": "unrunnable: batch hopper needs 2 GPUs with compute capability >= 10.0; "
            "best host h1 has 8 GPUs, 0 of them with compute capability >= 10.0",
        },
        id="unrunnable-on-every-host",
    ),
    pytest.param(
        [host("h1")],
        [run("weekly", gpus=8, priority=SCHEDULED, at=0), run("pr", gpus=8, priority=PR, at=5)],
        {
            "pr": "h1:0,1,2,3,4,5,6,7",
            "weekly": "wait: waiting for 8 idle GPUs; GPUs 0-7 on h1 reserved for it, "
            "expected free at 14:10 UTC",
        },
        id="priority-before-enqueue-time",
    ),
    pytest.param(
        [host("h1", 2)],
        [run("later", gpus=2, at=5), run("first", gpus=2, at=0)],
        {
            "first": "h1:0,1",
            "later": "wait: waiting for 2 idle GPUs; "
            "GPUs 0,1 on h1 reserved for it, expected free at 14:10 UTC",
        },
        id="enqueue-time-orders-equal-priority",
    ),
    pytest.param(
        [host("h1")],
        [
            run("7", gpus=4, minutes=2.8),
            run("10", gpus=8, minutes=29),
            run("6", gpus=4, minutes=3.75),
        ],
        {
            "10": "h1:0,1,2,3,4,5,6,7",
            "6": "wait: waiting for 4 idle GPUs; GPUs 0-3 on h1 reserved for it, "
            "expected free at 14:29 UTC",
            "7": "wait: waiting for 4 idle GPUs; none is idle",
        },
        id="largest-gpu-minutes-first-among-equals",
    ),
    pytest.param(
        [host("h1", busy=busy_all(10, but=(6, 7)))],
        [run("big", gpus=8, at=0), run("long", minutes=20, at=1), run("short", minutes=5, at=2)],
        {
            "big": "wait: waiting for 8 idle GPUs; GPUs 0-7 on h1 reserved for it, "
            "expected free at 14:10 UTC",
            "long": "wait: held back so batch big can start at 14:10 UTC (reserved GPUs 0-7 on h1)",
            "short": "h1:6",
        },
        id="reservation-admits-only-runs-ending-before-it",
    ),
    pytest.param(
        [host("h1", busy={0: 10, 1: 10, 2: 10, 3: 10, 4: 60, 5: 60})],
        [run("four", gpus=4, at=0), run("long", minutes=120, at=1), run("more", minutes=120, at=2)],
        {
            "four": "wait: waiting for 4 idle GPUs; GPUs 0-3 on h1 reserved for it, "
            "expected free at 14:10 UTC",
            "long": "h1:6",
            "more": "h1:7",
        },
        id="backfill-into-gpus-outside-the-reservation",
    ),
    pytest.param(
        [host("h1", busy=busy_all(45, but=(7,))), host("h2", busy=busy_all(15, but=(0, 1)))],
        [run("big", gpus=8), run("long", minutes=30, at=1)],
        {
            "big": "wait: waiting for 8 idle GPUs; GPUs 0-7 on h2 reserved for it, "
            "expected free at 14:15 UTC",
            "long": "h1:7",
        },
        id="reservation-on-the-host-free-first",
    ),
    pytest.param(
        [host("h1", busy=busy_all(-5, but=(7,)))],
        [run("big", gpus=8), run("quick", minutes=1, at=1)],
        {
            "big": "wait: waiting for 8 idle GPUs; GPUs 0-7 on h1 reserved for it, "
            "free once the runs holding them end",
            "quick": "wait: held back so batch big can start once the runs holding its GPUs end "
            "(reserved GPUs 0-7 on h1)",
        },
        id="overdue-runs-hold-everything-back",
    ),
    pytest.param(
        [host("down", alive=False), host("up", 2, busy={1: 30})],
        [run("one", at=0), run("big", gpus=8, at=1), run("two", gpus=2, at=2)],
        {
            "one": "up:0",
            "big": "wait: waiting for 8 idle GPUs: only down can run it, and it is not alive",
            "two": "wait: waiting for 2 idle GPUs; GPUs 0,1 on up reserved for it, "
            "expected free at 14:30 UTC",
        },
        id="dead-hosts-are-not-used",
    ),
    pytest.param(
        [host("down", alive=False)],
        [run("one")],
        {"one": "wait: no GPU host is alive"},
        id="no-host-alive",
    ),
    pytest.param(
        [],
        [run("one"), run("cpu", gpus=0)],
        {"one": "wait: no GPU host is alive", "cpu": "wait: no GPU host is alive"},
        id="no-host-known-is-not-unrunnable",
    ),
    pytest.param(
        [host("h1", busy={7: None})],
        [run("big", gpus=8), run("small", minutes=120, at=1)],
        {"big": "wait: waiting for 8 idle GPUs; largest idle set: 7 on h1", "small": "h1:0"},
        id="foreign-process-gives-no-reservation-and-holds-nothing",
    ),
    pytest.param(
        [host("h1", busy={7: None, 0: 10, 1: 10, 2: 10, 3: 10, 4: 10})],
        [run("big", gpus=8), run("four", gpus=4, at=1), run("small", minutes=120, at=2)],
        {
            "big": "wait: waiting for 8 idle GPUs; largest idle set: 2 on h1",
            "four": "wait: waiting for 4 idle GPUs; GPUs 0-3 on h1 reserved for it, "
            "expected free at 14:10 UTC",
            "small": "h1:5",
        },
        id="next-run-gets-the-reservation-when-head-has-none",
    ),
    pytest.param(
        [host("h1", busy=busy_all(10, but=(7,))), host("cpu-box", 0)],
        [run("lint", gpus=0)],
        {"lint": "cpu-box:"},
        id="cpu-only-batch-needs-no-gpu",
    ),
]


TORCH = "base:torch2.13-cu13.0"


def replace_needs(pending: PendingRun, needs: str, runtime: str) -> PendingRun:
    return replace(pending, needs=needs, runtime=runtime)


def torch_run(run_id: str, gpus: int = 1) -> PendingRun:
    return replace_needs(run(run_id, gpus), TORCH, "torch")


def with_runtimes(view: HostView, *provides: str, refusing: str = "") -> HostView:
    return replace(view, provides=frozenset(provides), refusing=refusing)


RUNTIME_CASES = [
    pytest.param(
        [host("plain"), with_runtimes(host("qualified", 2), "base:default", TORCH)],
        [torch_run("t", 2), run("p")],
        {"t": "qualified:0,1", "p": "plain:0"},
        id="a-run-goes-only-where-its-runtime-is",
    ),
    pytest.param(
        [host("plain")],
        [torch_run("t")],
        {"t": "wait: waiting: no host provides runtime torch (torch2.13-cu13.0)"},
        id="no-host-provides-the-runtime",
    ),
    pytest.param(
        [with_runtimes(host("h1"), "base:default", "image")],
        [replace_needs(run("c"), "image", "trl")],
        {"c": "h1:0"},
        id="an-image-runtime-needs-a-host-with-an-engine",
    ),
    pytest.param(
        [host("plain")],
        [replace_needs(run("c"), "image", "trl")],
        {"c": "wait: waiting: no host provides runtime trl (containers)"},
        id="no-host-has-a-container-engine",
    ),
    pytest.param(
        [with_runtimes(host("full"), "base:default", refusing="only 2.0 GiB free on /var")],
        [run("p")],
        {"p": "wait: waiting: full takes no runs: only 2.0 GiB free on /var"},
        id="a-full-disk-takes-no-runs",
    ),
    pytest.param(
        [with_runtimes(host("full"), "base:default", refusing="disk"), host("h2", 1)],
        [run("p")],
        {"p": "h2:0"},
        id="another-host-takes-it",
    ),
]


@pytest.mark.parametrize(("hosts", "pending", "expected"), CASES + RUNTIME_CASES)
def test_plan(hosts: list[HostView], pending: list[PendingRun], expected: dict[str, str]) -> None:
    assert outcome(plan(pending, hosts, NOW)) == expected


def test_reservation_names_the_run_gpus_and_time() -> None:
    hosts = [host("h1", busy=busy_all(10, but=(6, 7)))]
    result = plan([run("big", gpus=8), run("short", minutes=5, at=1)], hosts, NOW)
    assert result.reservation == Reservation("big", "big", "h1", tuple(range(8)), NOW + 10 * MIN)
    assert result.assignments == [Assignment("short", "h1", (6,))]


def test_reservation_keeps_idle_gpus_open_when_busy_ones_free_in_time() -> None:
    """Needing 4 with 2 idle and 3 freeing at the same time: keep the 3 busy and one idle."""
    hosts = [host("h1", 5, busy={0: 10, 1: 10, 2: 10})]
    result = plan([run("four", gpus=4)], hosts, NOW)
    assert result.reservation is not None
    assert result.reservation.gpu_indices == (0, 1, 2, 3)


def test_waiting_positions_follow_planning_order() -> None:
    hosts = [host("h1", 2, busy={0: 10, 1: 10})]
    pending = [run("c", at=3), run("a", at=1), run("b", gpus=2, at=2)]
    result = plan(pending, hosts, NOW)
    assert [(r, w.position) for r, w in result.waiting.items()] == [("a", 1), ("b", 2), ("c", 3)]
    assert str(result.waiting["c"]).endswith("; position 3")


def test_reasons_do_not_tick_with_the_clock() -> None:
    """The scheduler updates a Check Run only when its reason changes: seconds must not show."""
    hosts = [host("h1", busy=busy_all(10.5, but=(6, 7)))]
    pending = [run("big", gpus=8), run("long", minutes=30, at=1), run("t4", gpu_model="T4", at=2)]
    plans = [plan(pending, hosts, NOW + s) for s in (0, 7, 29, 59)]
    assert all(p.waiting == plans[0].waiting for p in plans)
    assert "14:11 UTC" in plans[0].waiting["big"].reason  # 14:10:30 rounded up


def test_other_day_shows_the_date() -> None:
    hosts = [host("h1", busy=busy_all(12 * 60))]
    reason = plan([run("big", gpus=8)], hosts, NOW).waiting["big"].reason
    assert reason.endswith("expected free at 2024-06-02 02:00 UTC")


def test_order_is_priority_time_gpu_minutes_then_id() -> None:
    pending = [
        run("z", gpus=1, minutes=10),
        run("y", gpus=2, minutes=10),
        run("x", gpus=2, minutes=10),
        run("early", priority=SCHEDULED, at=-5),
        run("cmd", priority=COMMAND, at=-1),
    ]
    assert [r.run_id for r in sorted(pending, key=run_order)] == ["x", "y", "z", "cmd", "early"]


def test_plan_does_not_depend_on_input_order() -> None:
    hosts = [host("h1", busy={0: 10}), host("h2", 4, busy={3: None})]
    pending = [run(f"r{i}", gpus=g, at=i % 3) for i, g in enumerate([1, 2, 4, 8, 1, 2])]
    expected = plan(pending, hosts, NOW)
    shuffled = random.Random(7).sample(pending, len(pending))
    assert plan(shuffled, list(reversed(hosts)), NOW) == expected


def test_module_is_pure() -> None:
    """Planning imports no web, Redis, GitHub or process machinery, nor the GPU workers."""
    code = (
        "import sys, bot.planner;"
        "bad = {'flask', 'redis', 'rq', 'github', 'subprocess', 'requests', 'workers'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- property: whatever the situation, a plan never double-books or misplaces a GPU -------------

_MODELS = st.sampled_from([H20, A100, T4])
IDLE = "idle"


@st.composite
def _hosts(draw: st.DrawFn) -> list[HostView]:
    hosts = []
    for number in range(draw(st.integers(0, 3))):
        models = draw(st.lists(_MODELS, max_size=8))
        # Per GPU: idle (absent from `busy`), our run ending in some minutes, or foreign (None).
        states = st.one_of(st.just(IDLE), st.none(), st.floats(-30, 240))
        drawn = draw(st.lists(states, min_size=len(models), max_size=len(models)))
        busy = {i: s for i, s in enumerate(drawn) if not isinstance(s, str)}
        hosts.append(host(f"h{number}", models, busy, alive=draw(st.booleans())))
    return hosts


@st.composite
def _runs(draw: st.DrawFn) -> list[PendingRun]:
    runs = []
    for number in range(draw(st.integers(0, 10))):
        constraints = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "gpu_model": st.sampled_from(["H20", "A100", "T4"]),
                    "min_memory_mb": st.sampled_from([16000, 80000, 90000]),
                    "min_compute_capability": st.sampled_from([(7, 0), (8, 0), (9, 0)]),
                },
            )
        )
        runs.append(
            run(
                f"r{number}",
                gpus=draw(st.sampled_from([0, 1, 2, 4, 8])),
                minutes=draw(st.floats(0.5, 300)),
                priority=draw(st.sampled_from(list(Priority))),
                at=draw(st.integers(0, 3)),
                **constraints,
            )
        )
    return runs


@settings(max_examples=400, deadline=None)
@given(_hosts(), _runs())
def test_plan_never_double_books_or_misplaces(
    hosts: list[HostView], runs: list[PendingRun]
) -> None:
    result = plan(runs, hosts, NOW)
    by_host = {h.name: h for h in hosts}
    by_run = {r.run_id: r for r in runs}
    taken = [(a.host, i) for a in result.assignments for i in a.gpu_indices]
    assert len(taken) == len(set(taken))
    for a in result.assignments:
        view, pending = by_host[a.host], by_run[a.run_id]
        slots = {s.index: s.gpu for s in view.gpus}
        assert view.alive
        assert len(a.gpu_indices) == pending.batch.gpus
        assert all(i in view.idle and gpu_matches(pending.batch, slots[i]) for i in a.gpu_indices)
        _assert_respects(result.reservation, a, pending)
    fates = [*(a.run_id for a in result.assignments), *result.waiting, *result.unrunnable]
    assert sorted(fates) == sorted(by_run)
    assert [w.position for w in result.waiting.values()] == list(range(1, len(result.waiting) + 1))
    assert all(isinstance(w, Wait) and w.reason for w in result.waiting.values())


def _assert_respects(hold: Reservation | None, a: Assignment, pending: PendingRun) -> None:
    """A run on reserved GPUs must be expected to end by the time the reservation starts."""
    if hold and hold.host == a.host and set(a.gpu_indices) & set(hold.gpu_indices):
        assert NOW + pending.expected_s <= hold.start_at
