"""Runtimes' caches through real sandboxed runs: kept per repository and runtime for trusted
code, read-only or a discarded copy for untrusted code, bounded with LRU eviction."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

from contract.config import Runtime
from tests.sandboxing import repo, request
from workers.caches import CachePlan, cache_dir, evict_lru, prepare_caches, trim
from workers.runner import RunOutcome, run_batch

CACHES = ("HF_HOME", "UV_CACHE_DIR", "TORCH_EXTENSIONS_DIR")
# What was in each cache when the run started, then whether the run could write there.
WRITE_CACHES = f"""
import json, os
from pathlib import Path


def test_write_caches():
    found = {{}}
    for variable in {CACHES!r}:
        mark = Path(os.environ[variable]) / "mark"
        before = mark.read_text() if mark.exists() else ""
        try:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.write_text(os.environ["WHO"])
            wrote = "written"
        except OSError as exc:
            wrote = type(exc).__name__
        found[variable] = [before, wrote]
    Path("caches.json").write_text(json.dumps(found))
"""

RUNTIME = Runtime("torch", caches={"huggingface": None, "torch-extensions": None})


def caches_run(tmp_path: Path, base: Path, bwrap: str, who: str, trusted: bool) -> RunOutcome:
    plan = CachePlan(tmp_path / "caches", "acme/gpu", trusted)
    source = repo(tmp_path / who, {"test_caches.py": WRITE_CACHES})
    made = request(tmp_path, source, base, bwrap=bwrap, runtime=RUNTIME, env={"WHO": who})
    return run_batch(replace(made, caches=plan))


def seen_by(outcome: RunOutcome) -> dict[str, list[str]]:
    """Each cache variable -> [what the run found there, whether it could write]."""
    found: dict[str, list[str]] = json.loads(
        (outcome.workdir / "box" / "src" / "caches.json").read_text()
    )
    return found


def test_trusted_runs_keep_caches_and_untrusted_ones_cannot_poison_them(
    tmp_path: Path, base: Path, bwrap: str
) -> None:
    trusted = caches_run(tmp_path, base, bwrap, "maintainer", trusted=True)
    fork = caches_run(tmp_path, base, bwrap, "fork", trusted=False)
    after = caches_run(tmp_path, base, bwrap, "next", trusted=True)

    assert seen_by(trusted) == {key: ["", "written"] for key in CACHES}
    # The fork's run finds what trusted runs cached: the hub read-only, the rest as copies...
    assert seen_by(fork) == {
        "HF_HOME": ["maintainer", "OSError"],
        "UV_CACHE_DIR": ["maintainer", "written"],
        "TORCH_EXTENSIONS_DIR": ["maintainer", "written"],
    }
    # ...and the next trusted run finds none of the fork's writes.
    assert seen_by(after) == {key: ["maintainer", "written"] for key in CACHES}
    hub = cache_dir(tmp_path / "caches", "acme/gpu", "torch", "huggingface")
    assert (hub / "mark").read_text() == "next"


def test_caches_are_kept_per_repository_and_runtime(tmp_path: Path) -> None:
    root = tmp_path / "caches"

    one = prepare_caches(CachePlan(root, "acme/gpu", True), RUNTIME, tmp_path / "c1")
    other = prepare_caches(CachePlan(root, "other/repo", True), RUNTIME, tmp_path / "c2")

    assert one.env["HF_HOME"] == str(root / "acme__gpu" / "torch" / "huggingface")
    assert other.env["HF_HOME"] == str(root / "other__repo" / "torch" / "huggingface")
    assert one.env["UV_CACHE_DIR"] == str(root / "acme__gpu" / "torch" / "packages" / "uv")


def _file(path: Path, size: int, used: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (used, used))
    return path


def test_eviction_drops_the_least_recently_used_first(tmp_path: Path) -> None:
    now = time.time()
    old = _file(tmp_path / "c" / "a" / "old.bin", 400, now - 300)
    middle = _file(tmp_path / "c" / "b" / "middle.bin", 400, now - 200)
    new = _file(tmp_path / "c" / "b" / "new.bin", 400, now - 100)

    freed = evict_lru(tmp_path / "c", 900)

    assert freed == 400
    assert not old.exists() and middle.exists() and new.exists()
    assert not (tmp_path / "c" / "a").exists()  # emptied directories go too


def test_a_cache_over_its_limit_is_trimmed_after_a_trusted_run(tmp_path: Path) -> None:
    runtime = Runtime("torch", caches={"huggingface": 1})  # 1 MiB
    use = prepare_caches(CachePlan(tmp_path / "caches", "acme/gpu", True), runtime, tmp_path / "x")
    hub = Path(use.env["HF_HOME"])
    now = time.time()
    _file(hub / "old", 700 * 1024, now - 60)
    _file(hub / "new", 700 * 1024, now)

    freed = trim(use)

    assert freed[hub] == 700 * 1024
    assert (hub / "new").exists() and not (hub / "old").exists()


def test_untrusted_runs_trim_nothing(tmp_path: Path) -> None:
    use = prepare_caches(CachePlan(tmp_path / "c", "acme/gpu", False), RUNTIME, tmp_path / "x")

    assert use.persistent == () and trim(use) == {}
    assert use.read_only and use.writable  # read-only hub, copied packages and extensions
