"""Disk hygiene: run directories removed once stored (failed ones kept a while), orphans swept,
never one in use; the archive cache bounded; a full disk takes no runs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from workers import cleanup
from workers.results import ResultFileError, copy_result, read_result


def a_run_dir(root: Path, name: str, *, age_s: float = 0) -> Path:
    workdir = root / name
    (workdir / "box" / "src").mkdir(parents=True)
    (workdir / "box" / "src" / "data").write_text("x")
    (workdir / "box" / "src").chmod(0o500)  # what a run may leave behind
    if age_s:
        then = time.time() - age_s
        os.utime(workdir, (then, then))
    return workdir


def test_a_successful_run_directory_goes_at_once_and_a_failed_one_is_kept(tmp_path: Path) -> None:
    ok, failed = a_run_dir(tmp_path, "ok"), a_run_dir(tmp_path, "failed")
    now = time.time()

    assert cleanup.finish_workdir(ok, failed=False, keep_failed_s=3600, now=now)
    assert not cleanup.finish_workdir(failed, failed=True, keep_failed_s=3600, now=now)

    assert not ok.exists() and failed.exists()
    assert cleanup.sweep_workdirs(tmp_path, now + 60) == []  # kept for its hour
    assert cleanup.sweep_workdirs(tmp_path, now + 3601) == [failed]
    assert not failed.exists()


def test_keeping_failed_runs_can_be_turned_off(tmp_path: Path) -> None:
    failed = a_run_dir(tmp_path, "failed")

    assert cleanup.finish_workdir(failed, failed=True, keep_failed_s=0, now=time.time())
    assert not failed.exists()


def test_orphans_of_a_crash_are_swept_but_never_a_directory_in_use(tmp_path: Path) -> None:
    orphan = a_run_dir(tmp_path, "orphan", age_s=2 * 24 * 3600)
    running = a_run_dir(tmp_path, "running", age_s=2 * 24 * 3600)
    fresh = a_run_dir(tmp_path, "fresh")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cleanup.in_use(running):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        swept = cleanup.sweep_workdirs(tmp_path, time.time())
    finally:
        release.set()
        holder.join()

    assert swept == [orphan]
    assert running.exists() and fresh.exists()


def test_the_archive_cache_is_bounded(tmp_path: Path) -> None:
    archives = tmp_path / "archives" / "acme__gpu"
    archives.mkdir(parents=True)
    now = time.time()
    for age, name in ((300, "old"), (200, "mid"), (100, "new")):
        (archives / f"{name}.tar.gz").write_bytes(b"x" * 1000)
        os.utime(archives / f"{name}.tar.gz", (now - age, now - age))

    freed = cleanup.trim_archives(tmp_path / "archives", 2000)

    assert freed == 1000
    assert sorted(p.name for p in archives.iterdir()) == ["mid.tar.gz", "new.tar.gz"]


def test_a_disk_below_the_minimum_is_named_with_what_to_do(tmp_path: Path) -> None:
    assert cleanup.disk_problem(tmp_path / "not-yet" / "runs", 1) == ""
    problem = cleanup.disk_problem(tmp_path, 2**62)
    assert problem.startswith("only ") and "below GPUCI_MIN_FREE_DISK" in problem
    assert "free space or lower the setting" in problem


def test_results_are_read_only_as_regular_files_not_links(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("REDIS_URL=redis://:pw@host")
    (out / "junit.xml").symlink_to(secret)
    os.mkfifo(out / "report.jsonl")
    (out / "big").write_bytes(b"x" * 2000)

    with pytest.raises(ResultFileError, match=r"junit\.xml is not a regular file"):
        copy_result(out, "junit.xml", tmp_path / "copy", 10_000)
    with pytest.raises(ResultFileError, match=r"report\.jsonl is not a regular file"):
        copy_result(out, "report.jsonl", tmp_path / "copy", 10_000)
    with pytest.raises(ResultFileError, match="big is over 1000 bytes"):
        read_result(out, "big", 1000)
    with pytest.raises(ResultFileError, match="big is over 1000 bytes"):
        copy_result(out, "big", tmp_path / "copy", 1000)
    assert copy_result(out, "absent", tmp_path / "copy", 10) is None
    assert not (tmp_path / "copy").exists()  # nothing half-copied is left
