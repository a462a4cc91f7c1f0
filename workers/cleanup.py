"""Disk hygiene of a GPU host: run directories removed once their result is stored (failed ones
kept a while for debugging), the archive cache bounded, and no new runs on a full disk."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from workers.caches import evict_lru

KEEP_UNTIL = ".gpuci-keep-until"  # in a kept run directory: when it may be removed (epoch s)
IN_USE = ".gpuci-in-use"  # locked by the worker while its run is on
_ORPHAN_AGE_S = 24 * 3600  # an unmarked directory no run holds, left by a crash


@contextlib.contextmanager
def in_use(workdir: Path) -> Iterator[None]:
    """Hold the run directory's lock while its run is on: a sweep never removes it meanwhile."""
    with (workdir / IN_USE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def finish_workdir(workdir: Path, *, failed: bool, keep_failed_s: int, now: float) -> bool:
    """After the run's result is stored: remove its directory, or mark a failed run's to be
    kept `keep_failed_s`. True when it was removed."""
    if failed and keep_failed_s > 0:
        (workdir / KEEP_UNTIL).write_text(str(now + keep_failed_s))
        return False
    remove_tree(workdir)
    return True


def sweep_workdirs(work_root: Path, now: float) -> list[Path]:
    """Remove kept directories whose time is over and orphans of a crash; never one in use."""
    removed = []
    for workdir in sorted(work_root.iterdir()) if work_root.is_dir() else []:
        if workdir.is_dir() and not workdir.is_symlink() and _expired(workdir, now):
            with _unless_in_use(workdir) as free:
                if free:
                    remove_tree(workdir)
                    removed.append(workdir)
    return removed


def _expired(workdir: Path, now: float) -> bool:
    try:
        return float((workdir / KEEP_UNTIL).read_text()) <= now
    except FileNotFoundError:
        return workdir.stat().st_mtime + _ORPHAN_AGE_S <= now
    except (OSError, ValueError):
        return True


@contextlib.contextmanager
def _unless_in_use(workdir: Path) -> Iterator[bool]:
    lock_path = workdir / IN_USE
    if not lock_path.exists():
        yield True
        return
    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def remove_tree(root: Path) -> None:
    """Remove a run's directory, whatever modes its processes left on what they wrote."""
    for parent, dirs, _files in os.walk(root):
        for name in dirs:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)


def trim_archives(archives: Path, max_bytes: int) -> int:
    """Keep the archive cache under `max_bytes`, least recently used archives first."""
    return evict_lru(archives, max_bytes) if archives.is_dir() else 0


def disk_problem(path: Path, min_free_bytes: int) -> str:
    """Why this host takes no new runs for lack of disk, or "" when it has room."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    if usage.free >= min_free_bytes:
        return ""
    return (
        f"only {_gib(usage.free)} free on {probe}, below GPUCI_MIN_FREE_DISK "
        f"({_gib(min_free_bytes)}): free space or lower the setting"
    )


def _gib(count: int) -> str:
    return f"{count / 1024**3:.1f} GiB"
