"""Named caches of a runtime (packages, Hugging Face hub, torch hub, torch extensions, Triton):
kept per repository and runtime between runs, read-only or a discarded copy for untrusted code,
each bounded in size with least-recently-used eviction."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contract.config import Runtime

LOCK_NAME = ".gpuci-lock"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class CacheKind:
    """A cache's variables (name -> sub-directory) and what untrusted code gets of it."""

    variables: dict[str, str]
    untrusted: str  # "copy": a copy discarded after the run; "read-only": the cache, read-only


# One table of every cache a runtime may declare. `packages` is always on: it is what makes a
# warm install take seconds. A read-only package cache would break uv (it locks its cache).
CACHE_KINDS: dict[str, CacheKind] = {
    "packages": CacheKind({"UV_CACHE_DIR": "uv", "PIP_CACHE_DIR": "pip"}, "copy"),
    "huggingface": CacheKind({"HF_HOME": ""}, "read-only"),
    "torch-hub": CacheKind({"TORCH_HOME": ""}, "read-only"),
    "torch-extensions": CacheKind({"TORCH_EXTENSIONS_DIR": ""}, "copy"),
    "triton": CacheKind({"TRITON_CACHE_DIR": ""}, "copy"),
}


@dataclass(frozen=True)
class CachePlan:
    """Where this host keeps caches, whose run this is, and the default size limit."""

    root: Path
    repo: str
    trusted: bool
    default_max_mb: int = 20 * 1024


@dataclass(frozen=True)
class CacheUse:
    """A run's caches: variables to set, paths the sandbox mounts, and what to trim after."""

    env: dict[str, str] = field(default_factory=dict)
    writable: tuple[Path, ...] = ()  # persistent caches (trusted runs) and discarded copies
    read_only: tuple[Path, ...] = ()
    persistent: tuple[tuple[Path, int], ...] = ()  # (directory, limit in bytes) to trim after


def cache_dir(root: Path, repo: str, runtime: str, name: str) -> Path:
    """`<root>/<owner>__<name>/<runtime>/<cache>`."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", repo.replace("/", "__")) or "_"
    return root / slug / re.sub(r"[^A-Za-z0-9._-]", "_", runtime) / name


def prepare_caches(plan: CachePlan, runtime: Runtime, copies: Path) -> CacheUse:
    """The runtime's caches for one run; untrusted runs' copies are made under `copies`."""
    names = {"packages": None, **runtime.caches}
    env: dict[str, str] = {}
    writable: list[Path] = []
    read_only: list[Path] = []
    persistent: list[tuple[Path, int]] = []
    for name, limit_mb in names.items():
        kind = CACHE_KINDS[name]
        home = cache_dir(plan.root, plan.repo, runtime.name, name)
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if plan.trusted:
            seen = home
            writable.append(home)
            persistent.append((home, (limit_mb or plan.default_max_mb) * _MIB))
        elif kind.untrusted == "copy":
            seen = copies / name
            shutil.copytree(home, seen, symlinks=True, ignore=shutil.ignore_patterns(LOCK_NAME))
            writable.append(seen)
        else:
            seen = home
            read_only.append(home)
        for variable, sub in kind.variables.items():
            env[variable] = str(seen / sub) if sub else str(seen)
    return CacheUse(env, tuple(writable), tuple(read_only), tuple(persistent))


@contextlib.contextmanager
def in_use(caches: CacheUse | None) -> Iterator[None]:
    """Hold a shared lock on each persistent cache for the run: no eviction meanwhile."""
    with contextlib.ExitStack() as stack:
        for directory, _ in caches.persistent if caches else ():
            lock = stack.enter_context((directory / LOCK_NAME).open("a"))
            fcntl.flock(lock, fcntl.LOCK_SH)
        yield


def trim(caches: CacheUse | None) -> dict[Path, int]:
    """After a trusted run: bring each persistent cache under its limit (skipped while another
    run holds it). Returns the bytes freed per directory."""
    freed = {}
    for directory, limit in caches.persistent if caches else ():
        with (directory / LOCK_NAME).open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use by a concurrent run: the next run trims it
            freed[directory] = evict_lru(directory, limit)
    return freed


def evict_lru(directory: Path, max_bytes: int) -> int:
    """Delete the least recently used files (by the later of access and change time) until
    the directory holds at most `max_bytes`; returns the bytes freed. Links are not followed."""
    files = []
    total = 0
    for parent, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            if name == LOCK_NAME:
                continue
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                files.append((max(info.st_atime, info.st_mtime), info.st_size, path))
                total += info.st_size
    freed = 0
    for _used, size, path in sorted(files):
        if total - freed <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            freed += size
    _remove_empty_dirs(directory)
    return freed


def _remove_empty_dirs(directory: Path) -> None:
    for parent, _dirs, _names in os.walk(directory, topdown=False):
        if Path(parent) != directory:
            with contextlib.suppress(OSError):  # not empty
                os.rmdir(parent)
