"""Process-tree hygiene: stop a run's process group and every process that carries its marker."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

# Every process of a run inherits this variable; processes that leave the run's process group
# (setsid, double fork) still carry it in /proc/<pid>/environ, as Jenkins' ProcessTreeKiller relies
# on. A process that re-executes itself with a cleared environment escapes it.
RUN_MARKER_VAR = "GPUCI_RUN_TOKEN"

PROC = Path("/proc")
_POLL_S = 0.05
_SWEEP_ROUNDS = 5


def marked_pids(token: str) -> set[int]:
    """Live processes whose initial environment holds `GPUCI_RUN_TOKEN=<token>`, never ours."""
    needle = f"{RUN_MARKER_VAR}={token}".encode()
    found = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.add(int(entry.name))
    return found - _protected_pids()


def group_members(pgid: int) -> set[int]:
    """Processes of process group `pgid` that are still running (zombies excluded)."""
    members = set()
    for entry in PROC.iterdir():
        stat = _stat(entry.name) if entry.name.isdigit() else None
        if stat and stat[2] == pgid and stat[0] not in "ZX":
            members.add(int(entry.name))
    return members


def kill_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False if it is gone. Refuses our own group."""
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to signal process group {pgid}: it is not a run's group")
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def terminate_run(
    pgid: int,
    token: str,
    grace_s: float,
    extra_pids: Iterable[int] = (),
    spare: Iterable[int] = (),
) -> list[int]:
    """SIGTERM the group (but `spare`), wait up to `grace_s`, SIGKILL it, then SIGKILL the
    stragglers.

    Stragglers are processes still carrying the run's marker and `extra_pids` (compute
    processes left on the run's GPUs). `spare` (a sandbox's bwrap, whose exit ends every
    process in it at once) gets only the SIGKILL. Returns the pids killed after the group.
    """
    spared = set(spare)
    if spared:
        kill_pids_with(group_members(pgid) - spared, signal.SIGTERM)
        _wait_until_gone(pgid, grace_s, ignore=spared)
    else:
        kill_group(pgid, signal.SIGTERM)
        _wait_until_gone(pgid, grace_s)
    kill_group(pgid, signal.SIGKILL)
    _wait_until_gone(pgid, 1.0)
    killed = set(kill_pids(extra_pids))
    killed.update(kill_marked(token))
    return sorted(killed)


def kill_marked(token: str) -> list[int]:
    """SIGKILL every process carrying the run's marker, in rounds until none is left."""
    killed: set[int] = set()
    for _ in range(_SWEEP_ROUNDS):
        alive = {pid for pid in marked_pids(token) if _running(pid)}
        if not alive:
            break
        killed.update(kill_pids(alive))
        time.sleep(_POLL_S)
    return sorted(killed)


def kill_pids(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid (never ourselves, an ancestor or init); return those signalled."""
    killed = []
    for pid in sorted(set(pids) - _protected_pids()):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        killed.append(pid)
    return killed


def kill_pids_with(pids: Iterable[int], sig: int) -> None:
    """Send `sig` to each pid (never ourselves, an ancestor or init)."""
    for pid in sorted(set(pids) - _protected_pids()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_until_gone(pgid: int, timeout_s: float, ignore: set[int] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while (group_members(pgid) - (ignore or set())) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, or None if it is gone."""
    try:
        raw = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _running(pid: int) -> bool:
    stat = _stat(str(pid))
    return stat is not None and stat[0] not in "ZX"


def _protected_pids() -> set[int]:
    """This process and its ancestors up to init: a sweep must never reach them."""
    protected = {0, 1}
    pid = os.getpid()
    while pid > 1 and pid not in protected:
        protected.add(pid)
        stat = _stat(str(pid))
        pid = stat[1] if stat else 0
    return protected


def children(pid: int) -> set[int]:
    """The direct children of `pid` (from each process's parent in /proc)."""
    found = set()
    for entry in PROC.iterdir():
        stat = _stat(entry.name) if entry.name.isdigit() else None
        if stat and stat[1] == pid:
            found.add(int(entry.name))
    return found
