"""The planner as it was before the fleet-scale rewrite, kept to compare decisions against.

It matches every run's constraints against every GPU of every host, so a round costs hosts x
runs; bot/planner.py must decide exactly as this does (tests/test_planner_scale.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.planner import (
    Assignment,
    HostView,
    PendingRun,
    Plan,
    Reservation,
    Wait,
    _free_when,
    _need,
    _start_when,
    run_order,
)
from contract.config import Batch, gpu_matches, natural_sort, why_unrunnable


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
    """
    board = _Board([h for h in hosts if h.alive], now)
    inventory = {h.name: [slot.gpu for slot in h.gpus] for h in hosts}
    result = Plan()
    waiting: list[tuple[PendingRun, str]] = []
    for run in sorted(pending, key=run_order):
        unrunnable = why_unrunnable(run.batch, inventory) if inventory else None
        if unrunnable:
            result.unrunnable[run.run_id] = unrunnable
            continue
        assignment = board.place(run, result.reservation)
        if assignment:
            result.assignments.append(assignment)
            continue
        if result.reservation is None:
            result.reservation = board.reserve(run)
        waiting.append((run, _wait_reason(run, board, result.reservation, hosts)))
    result.waiting = {
        run.run_id: Wait(reason, position)
        for position, (run, reason) in enumerate(waiting, start=1)
    }
    return result


class _Board:
    """The alive hosts' GPUs during one plan: which are free now, and when the others free up."""

    def __init__(self, hosts: Sequence[HostView], now: float):
        self.now = now
        self.names = natural_sort(h.name for h in hosts)
        self.slots = {h.name: {slot.index: slot.gpu for slot in h.gpus} for h in hosts}
        self.free = {h.name: set(h.idle) & set(self.slots[h.name]) for h in hosts}
        self.ends = {h.name: _known_ends(h) for h in hosts}
        self.slots_left = {h.name: h.free_slots for h in hosts}
        self.provides = {h.name: h.provides for h in hosts}
        self.refusing = {h.name: h.refusing for h in hosts}

    def matching(self, host: str, batch: Batch) -> list[int]:
        """Indices of the host's GPUs that meet the batch's constraints."""
        return sorted(i for i, gpu in self.slots[host].items() if gpu_matches(batch, gpu))

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
        """The host leaving the fewest usable, then fewest free GPUs over, and its usable GPUs."""
        fits = [
            (h, u)
            for h in self.names
            if self.takes(h, run) and len(u := self.usable(h, run, hold)) >= run.batch.gpus
        ]
        return min(fits, key=lambda f: (len(f[1]), len(self.free[f[0]])), default=None)

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
        return Assignment(run.run_id, host, chosen)

    def reserve(self, run: PendingRun) -> Reservation | None:
        """The run's earliest foreseeable start: host, GPUs and time; None if unknown.

        Ties go to the host where the reservation keeps the fewest idle GPUs from backfill.
        """
        options = [r for h in self.names if (r := self._reservation_on(h, run))]
        return min(options, key=lambda r: r[0])[1] if options else None

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
        """The most free GPUs matching the batch on one host, and that host."""
        counts = [(sum(i in self.free[h] for i in self.matching(h, batch)), h) for h in self.names]
        return max(counts, key=lambda c: c[0], default=(0, ""))


def _known_ends(host: HostView) -> dict[int, float]:
    """Expected ends of the host's GPUs held by our runs (not idle, end known)."""
    indices = {slot.index for slot in host.gpus}
    return {
        i: end
        for i, end in host.busy_until.items()
        if end is not None and i in indices and i not in host.idle
    }


# --- why a run waits ---------------------------------------------------------------------------


def _wait_reason(
    run: PendingRun, board: _Board, hold: Reservation | None, hosts: Sequence[HostView]
) -> str:
    """Why the run waits, stable while the situation is: times are whole minutes."""
    need = _need(run.batch)
    if not board.names:
        return "no GPU host is alive"
    unprovided = _runtime_wait(run, hosts)
    if unprovided:
        return unprovided
    down = _only_down_hosts_can_run(run.batch, hosts)
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


def _only_down_hosts_can_run(batch: Batch, hosts: Sequence[HostView]) -> str:
    """The hosts that are not alive, when only they could run the batch; else empty."""
    if any(h.alive and _could_run(batch, h) for h in hosts):
        return ""
    return " or ".join(natural_sort(h.name for h in hosts if not h.alive and _could_run(batch, h)))


def _could_run(batch: Batch, host: HostView) -> bool:
    return why_unrunnable(batch, {host.name: [slot.gpu for slot in host.gpus]}) is None
