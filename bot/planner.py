"""Scheduling plans: which pending runs start now on which GPUs, and why the others wait."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

from contract.config import Batch, HostGpu, format_size, gpu_matches, natural_sort, why_unrunnable


class Priority(IntEnum):
    """Lower runs first: PR runs, then manual runs and commands, then scheduled Layer 3."""

    PULL_REQUEST = 0
    COMMAND = 1
    SCHEDULED = 2


@dataclass(frozen=True)
class PendingRun:
    """A run waiting for GPUs. `expected_s`: median of the batch's past durations, else timeout."""

    run_id: str
    batch: Batch
    priority: int
    enqueued_at: float
    expected_s: float
    needs: str = "base:default"  # the runtime a host must provide (`Runtime.requirement`)
    runtime: str = "default"  # the profile's name, for wait reasons

    @property
    def gpu_seconds(self) -> float:
        return self.batch.gpus * self.expected_s


@dataclass(frozen=True)
class HostGpuSlot:
    """One GPU of a host at its index (what `CUDA_VISIBLE_DEVICES` names)."""

    index: int
    gpu: HostGpu


@dataclass(frozen=True)
class HostView:
    """A GPU host as the scheduler sees it now.

    `idle`: indices not leased and free of foreign processes. `busy_until`: for GPUs leased by
    our runs, their expected end; None or absent means unknown (a foreign process, unhealthy).
    """

    name: str
    gpus: Sequence[HostGpuSlot]
    idle: frozenset[int] = frozenset()
    busy_until: Mapping[int, float | None] = field(default_factory=dict)
    alive: bool = True
    free_slots: int | None = None  # runs the host can still take at once (None: no limit)
    provides: frozenset[str] = frozenset({"base:default"})  # runtimes (`Runtime.requirement`)
    refusing: str = ""  # why the host takes no new runs now (a full disk), or ""


@dataclass(frozen=True)
class Assignment:
    """Start `run_id` now on these GPUs of `host` (lease them, enqueue on the host's queue)."""

    run_id: str
    host: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class Wait:
    """Why a run is not starting. `reason` changes only when the situation does (no clock)."""

    reason: str
    position: int  # 1-based among the waiting runs, in planning order

    def __str__(self) -> str:
        return f"{self.reason}; position {self.position}"


@dataclass(frozen=True)
class Reservation:
    """GPUs kept for the first run that cannot start, from `start_at` (epoch seconds)."""

    run_id: str
    batch: str
    host: str
    gpu_indices: tuple[int, ...]
    start_at: float  # now, when the runs holding them are overdue

    @property
    def where(self) -> str:
        """`GPUs 0-7 on h20-01`."""
        return f"{_gpu_list(self.gpu_indices)} on {self.host}"


@dataclass
class Plan:
    """One planning round: every pending run is in exactly one of the first three."""

    assignments: list[Assignment] = field(default_factory=list)
    waiting: dict[str, Wait] = field(default_factory=dict)
    unrunnable: dict[str, str] = field(default_factory=dict)
    reservation: Reservation | None = None


def run_order(run: PendingRun) -> tuple[int, float, float, str]:
    """Priority, then enqueue time, then larger GPU-seconds first, then run id.

    Larger-first among runs submitted together (a whole layer) is longest-processing-time
    first, which keeps the time until the last one finishes low.
    """
    return run.priority, run.enqueued_at, -run.gpu_seconds, run.run_id


def plan(pending: Sequence[PendingRun], hosts: Sequence[HostView], now: float) -> Plan:
    """Decide which runs start now, which wait and which no host can ever run.

    1. Runs are taken in `run_order`.
    2. A run that no known host (alive or not) has enough matching GPUs for is unrunnable.
       One that only a host that is not alive could run waits for that host.
    3. A run starts if some alive host has enough idle GPUs matching its constraints; of those
       hosts the best fit wins: the fewest usable idle GPUs left over, then the fewest idle
       GPUs left over, then the host name. On the host it takes the lowest indices, reserved
       GPUs last. Runs assigned earlier in the plan use up their GPUs.
    4. The first run that cannot start but whose start can be foreseen gets a reservation (EASY
       backfilling): the earliest time some alive host will have enough matching GPUs (idle
       now, or leased by our runs with a known end), on that host, with those GPUs. A later run
       may use reserved GPUs only if it is expected to end by then, so a stream of small runs
       never starves a large one. GPUs busy with foreign processes or unhealthy have no known
       end: a run needing them gets no reservation and holds nothing back, since keeping GPUs
       idle would not make another user's process leave sooner; once they are free, the run
       waits at most for our runs then holding the rest.
    5. Every run that does not start gets a `Wait` naming what it waits for.

    A round costs about runs + hosts x batch shapes, not runs x hosts: constraints are matched
    once per shape and GPU model, hosts are kept ranked by free matching GPUs, and what depends
    only on a run's shape (whether any host could run it, which runtime no host provides) is
    worked out once per shape.
    """
    fleet = _Fleet(hosts)
    board = _Board([h for h in hosts if h.alive], now, fleet.matcher)
    result = Plan()
    waiting: list[tuple[PendingRun, str]] = []
    for run in sorted(pending, key=run_order):
        unrunnable = fleet.why_unrunnable(run.batch)
        if unrunnable:
            result.unrunnable[run.run_id] = unrunnable
            continue
        assignment = board.place(run, result.reservation)
        if assignment:
            result.assignments.append(assignment)
            continue
        if result.reservation is None:
            result.reservation = board.reserve(run)
        waiting.append((run, _wait_reason(run, board, result.reservation, fleet)))
    result.waiting = {
        run.run_id: Wait(reason, position)
        for position, (run, reason) in enumerate(waiting, start=1)
    }
    return result


Shape = tuple[str | None, int | None, tuple[int, int] | None]  # a batch's per-GPU constraints


def _shape(batch: Batch) -> Shape:
    return batch.gpu_model, batch.min_memory_mb, batch.min_compute_capability


class _Matcher:
    """`gpu_matches`, asked once per batch shape and GPU model."""

    def __init__(self) -> None:
        self.known: dict[tuple[Shape, HostGpu], bool] = {}

    def __call__(self, batch: Batch, gpu: HostGpu) -> bool:
        key = (_shape(batch), gpu)
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = gpu_matches(batch, gpu)
        return found


class _Fleet:
    """Every known host, alive or not, for what depends only on a run's batch or runtime."""

    def __init__(self, hosts: Sequence[HostView]):
        self.hosts = hosts
        self.matcher = _Matcher()
        self.memo: dict[tuple[Any, ...], str] = {}
        self.gpus = {h.name: tuple(slot.gpu for slot in h.gpus) for h in hosts}
        # Hosts with the same GPUs decide `why_unrunnable` alike: the first by name stands for
        # them all, since that function takes the first best host in natural order.
        models: dict[tuple[HostGpu, ...], str] = {}
        for name in natural_sort(h.name for h in hosts):
            models.setdefault(self.gpus[name], name)
        self.inventory = {name: list(gpus) for gpus, name in models.items()}

    def why_unrunnable(self, batch: Batch) -> str | None:
        if not self.inventory:
            return None
        key = ("unrunnable", batch.name, batch.gpus, _shape(batch))
        if key not in self.memo:
            self.memo[key] = why_unrunnable(batch, self.inventory) or ""
        return self.memo[key] or None

    def runtime_wait(self, run: PendingRun) -> str:
        key = ("runtime", run.needs, run.runtime)
        if key not in self.memo:
            self.memo[key] = _runtime_wait(run, self.hosts)
        return self.memo[key]

    def only_down_hosts_can_run(self, batch: Batch) -> str:
        """The hosts that are not alive, when only they could run the batch; else empty."""
        key = ("down", batch.gpus, _shape(batch))
        if key not in self.memo:
            able = [h for h in self.hosts if self._could_run(batch, h)]
            self.memo[key] = (
                ""
                if any(h.alive for h in able)
                else " or ".join(natural_sort(h.name for h in able if not h.alive))
            )
        return self.memo[key]

    def _could_run(self, batch: Batch, host: HostView) -> bool:
        gpus = self.gpus[host.name]
        return batch.gpus == 0 or sum(self.matcher(batch, g) for g in gpus) >= batch.gpus


class _Ranking:
    """Hosts by a count (their free matching GPUs), ties broken by a sort key."""

    def __init__(self) -> None:
        self.buckets: dict[int, list[tuple[tuple[int, ...], str]]] = {}
        self.entries: dict[str, tuple[int, tuple[tuple[int, ...], str]]] = {}

    def put(self, host: str, count: int, tie: tuple[int, ...]) -> None:
        self.drop(host)
        entry = (tie, host)
        bisect.insort(self.buckets.setdefault(count, []), entry)
        self.entries[host] = (count, entry)

    def drop(self, host: str) -> None:
        old = self.entries.pop(host, None)
        if old is not None:
            bucket = self.buckets[old[0]]
            del bucket[bisect.bisect_left(bucket, old[1])]

    def lowest(self, at_least: int, skip: str | None) -> tuple[int, tuple[int, ...], str] | None:
        """The host with the lowest count >= `at_least`, then the lowest tie; not `skip`."""
        for count in sorted(c for c in self.buckets if c >= at_least):
            for tie, host in self.buckets[count][:2]:
                if host != skip:
                    return count, tie, host
        return None

    def highest(self) -> tuple[int, str] | None:
        """The highest count and its host with the lowest tie."""
        counts = [c for c, bucket in self.buckets.items() if bucket]
        if not counts:
            return None
        top = max(counts)
        return top, self.buckets[top][0][1]


class _Board:
    """The alive hosts' GPUs during one plan: which are free now, and when the others free up.

    Rankings of hosts by free matching GPUs, one per batch shape (and runtime, for the hosts
    that take runs), are built when a shape is first asked about and kept up to date as runs
    take GPUs, so finding the best fit does not look at every host.
    """

    def __init__(self, hosts: Sequence[HostView], now: float, matcher: _Matcher):
        self.now = now
        self.names = natural_sort(h.name for h in hosts)
        self.rank = {name: i for i, name in enumerate(self.names)}
        self.slots = {h.name: {slot.index: slot.gpu for slot in h.gpus} for h in hosts}
        self.free = {h.name: set(h.idle) & set(self.slots[h.name]) for h in hosts}
        self.ends = {h.name: _known_ends(h) for h in hosts}
        self.slots_left = {h.name: h.free_slots for h in hosts}
        self.provides = {h.name: h.provides for h in hosts}
        self.refusing = {h.name: h.refusing for h in hosts}
        self.matcher = matcher
        self._matching: dict[tuple[Shape, str], list[int]] = {}
        self._takers: dict[tuple[Shape, str], _Ranking] = {}  # (shape, runtime) -> hosts
        self._idle: dict[Shape, _Ranking] = {}
        self._unforeseeable: set[tuple[Shape, int]] = set()

    def matching(self, host: str, batch: Batch) -> list[int]:
        """Indices of the host's GPUs that meet the batch's constraints."""
        key = (_shape(batch), host)
        found = self._matching.get(key)
        if found is None:
            slots = self.slots[host]
            found = self._matching[key] = sorted(
                i for i, gpu in slots.items() if self.matcher(batch, gpu)
            )
        return found

    def free_matching(self, host: str, batch: Batch) -> int:
        free = self.free[host]
        return sum(i in free for i in self.matching(host, batch))

    def takes(self, host: str, run: PendingRun) -> bool:
        """Whether the host can start the run at all now: a free run slot, room on its disk,
        the run's runtime."""
        return (
            self.slots_left[host] != 0
            and not self.refusing[host]
            and run.needs in self.provides[host]
        )

    def usable(self, host: str, run: PendingRun, hold: Reservation | None) -> list[int]:
        """Free matching GPUs the run may take, reserved ones last: a run may borrow those
        only if it is expected to end by the time the reservation starts."""
        held = set(hold.gpu_indices) if hold and hold.host == host else set()
        may_borrow = hold is None or self.now + run.expected_s <= hold.start_at
        free = [i for i in self.matching(host, run.batch) if i in self.free[host]]
        allowed = [i for i in free if may_borrow or i not in held]
        return sorted(allowed, key=lambda i: (i in held, i))

    def best_fit(self, run: PendingRun, hold: Reservation | None) -> tuple[str, list[int]] | None:
        """The host leaving the fewest usable, then fewest free GPUs over, and its usable GPUs.

        Only the reservation's host can offer fewer usable GPUs than its ranking says (to a
        run that may not borrow them), so it alone is looked at apart from the ranking."""
        need = run.batch.gpus
        barred = hold.host if hold and self.now + run.expected_s > hold.start_at else None
        fits = []
        ranked = self._takers_of(run).lowest(need, skip=barred)
        if ranked is not None:
            count, tie, host = ranked
            fits.append(((count, *tie), host))
        if barred is not None and self.takes(barred, run):
            usable = self.usable(barred, run, hold)
            if len(usable) >= need:
                fits.append(((len(usable), len(self.free[barred]), self.rank[barred]), barred))
        if not fits:
            return None
        host = min(fits)[1]
        return host, self.usable(host, run, hold)

    def place(self, run: PendingRun, hold: Reservation | None) -> Assignment | None:
        """Assign the run on its best-fit host now, taking its GPUs off the board; or None."""
        fit = self.best_fit(run, hold)
        if fit is None:
            return None
        host, usable = fit
        chosen = tuple(sorted(usable[: run.batch.gpus]))
        self.free[host].difference_update(chosen)
        self.ends[host].update(dict.fromkeys(chosen, self.now + run.expected_s))
        left = self.slots_left[host]
        if left is not None:
            self.slots_left[host] = left - 1
        self._rerank(host)
        return Assignment(run.run_id, host, chosen)

    def _takers_of(self, run: PendingRun) -> _Ranking:
        """The hosts that take runs needing the run's runtime, by free GPUs of its shape."""
        key = (_shape(run.batch), run.needs)
        ranking = self._takers.get(key)
        if ranking is None:
            ranking = self._takers[key] = _Ranking()
            for host in self.names:
                if self.takes(host, run):
                    ranking.put(host, self.free_matching(host, run.batch), self._tie(host))
        return ranking

    def _idle_of(self, batch: Batch) -> _Ranking:
        """Every alive host by free GPUs of the batch's shape, ties by name."""
        ranking = self._idle.get(_shape(batch))
        if ranking is None:
            ranking = self._idle[_shape(batch)] = _Ranking()
            for host in self.names:
                ranking.put(host, self.free_matching(host, batch), (self.rank[host],))
        return ranking

    def _tie(self, host: str) -> tuple[int, int]:
        return len(self.free[host]), self.rank[host]

    def _rerank(self, host: str) -> None:
        """Move the host in every ranking after a run took some of its GPUs."""
        for (shape, _), ranking in self._takers.items():
            if host not in ranking.entries:
                continue
            if self.slots_left[host] == 0:
                ranking.drop(host)
            else:
                ranking.put(host, self._free_of_shape(host, shape), self._tie(host))
        for shape, ranking in self._idle.items():
            ranking.put(host, self._free_of_shape(host, shape), (self.rank[host],))

    def _free_of_shape(self, host: str, shape: Shape) -> int:
        free = self.free[host]
        return sum(i in free for i in self._matching[(shape, host)])

    def reserve(self, run: PendingRun) -> Reservation | None:
        """The run's earliest foreseeable start: host, GPUs and time; None if unknown.

        Ties go to the host where the reservation keeps the fewest idle GPUs from backfill.
        Which GPUs have a known free time does not change during a plan (a run placed takes
        free GPUs and gives them a known end), so a shape found unforeseeable stays so.
        """
        key = (_shape(run.batch), run.batch.gpus)
        if key in self._unforeseeable:
            return None
        options = [r for h in self.names if (r := self._reservation_on(h, run))]
        if not options:
            self._unforeseeable.add(key)
            return None
        return min(options, key=lambda r: r[0])[1]

    def _reservation_on(
        self, host: str, run: PendingRun
    ) -> tuple[tuple[float, int], Reservation] | None:
        need = run.batch.gpus
        times = {
            i: t
            for i in self.matching(host, run.batch)
            if (t := self.free_time(host, i)) is not None
        }
        if need == 0 or len(times) < need:
            return None
        start = sorted(times.values())[need - 1]
        # Of the GPUs free by then, keep those freeing last, so idle ones stay open to backfill.
        eligible = sorted((i for i, t in times.items() if t <= start), key=lambda i: (-times[i], i))
        chosen = tuple(sorted(eligible[:need]))
        idle_kept = sum(i in self.free[host] for i in chosen)
        reservation = Reservation(run.run_id, run.batch.name, host, chosen, start)
        return (start, idle_kept), reservation

    def free_time(self, host: str, index: int) -> float | None:
        """When the GPU should be free: now if idle, its run's expected end, None if unknown."""
        if index in self.free[host]:
            return self.now
        end = self.ends[host].get(index)
        return None if end is None else max(self.now, end)

    def largest_idle(self, batch: Batch) -> tuple[int, str]:
        """The most free GPUs matching the batch on one host, and that host (first by name)."""
        return self._idle_of(batch).highest() or (0, "")


def _known_ends(host: HostView) -> dict[int, float]:
    """Expected ends of the host's GPUs held by our runs (not idle, end known)."""
    indices = {slot.index for slot in host.gpus}
    return {
        i: end
        for i, end in host.busy_until.items()
        if end is not None and i in indices and i not in host.idle
    }


# --- why a run waits ---------------------------------------------------------------------------


def _wait_reason(run: PendingRun, board: _Board, hold: Reservation | None, fleet: _Fleet) -> str:
    """Why the run waits, stable while the situation is: times are whole minutes."""
    need = _need(run.batch)
    if not board.names:
        return "no GPU host is alive"
    unprovided = fleet.runtime_wait(run)
    if unprovided:
        return unprovided
    down = fleet.only_down_hosts_can_run(run.batch)
    if down:
        return f"waiting for {need}: only {down} can run it, and it is not alive"
    if hold and hold.run_id == run.run_id:
        return f"waiting for {need}; {hold.where} reserved for it, {_free_when(hold, board.now)}"
    if hold and board.best_fit(run, None):
        return (
            f"held back so batch {hold.batch} can start {_start_when(hold, board.now)} "
            f"(reserved {hold.where})"
        )
    count, host = board.largest_idle(run.batch)
    return f"waiting for {need}; " + (
        f"largest idle set: {count} on {host}" if count else "none is idle"
    )


def _runtime_wait(run: PendingRun, hosts: Sequence[HostView]) -> str:
    """Why no alive host can take the run whatever its GPUs: its runtime, or full disks."""
    alive = [h for h in hosts if h.alive]
    having = [h for h in alive if run.needs in h.provides]
    if not having:
        what = run.needs.split(":", 1)[1] if run.needs.startswith("base:") else "containers"
        return f"waiting: no host provides runtime {run.runtime} ({what})"
    if all(h.refusing for h in having):
        return "waiting: " + "; ".join(f"{h.name} takes no runs: {h.refusing}" for h in having)
    return ""


def _need(batch: Batch) -> str:
    """`8 idle GPUs`, `2 idle GPUs with compute capability >= 8.0`."""
    count = f"{batch.gpus} idle GPU" + ("" if batch.gpus == 1 else "s")
    wanted = []
    if batch.gpu_model:
        wanted.append(f"model {batch.gpu_model}")
    if batch.min_memory_mb:
        wanted.append(f"at least {format_size(batch.min_memory_mb)} memory")
    if batch.min_compute_capability:
        major, minor = batch.min_compute_capability
        wanted.append(f"compute capability >= {major}.{minor}")
    return f"{count} with {' and '.join(wanted)}" if wanted else count


def _free_when(hold: Reservation, now: float) -> str:
    if hold.start_at <= now:
        return "free once the runs holding them end"
    return f"expected free at {_clock(hold.start_at, now)}"


def _start_when(hold: Reservation, now: float) -> str:
    if hold.start_at <= now:
        return "once the runs holding its GPUs end"
    return f"at {_clock(hold.start_at, now)}"


def _clock(at: float, now: float) -> str:
    """`14:05 UTC`, rounded up to the minute; with the date when it is not today."""
    when = datetime.fromtimestamp(math.ceil(at / 60) * 60, UTC)
    today = datetime.fromtimestamp(now, UTC).date()
    return when.strftime("%H:%M UTC" if when.date() == today else "%Y-%m-%d %H:%M UTC")


def _gpu_list(indices: Iterable[int]) -> str:
    """`GPU 5`, `GPUs 0-3,6`."""
    ordered = sorted(indices)
    runs: list[list[int]] = []
    for i in ordered:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ",".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ",".join(map(str, r)) for r in runs)
    return f"GPU{'' if len(ordered) == 1 else 's'} {text}"
