"""`gpuci demo --once`: the whole system plays its story and leaves no process behind."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.cli import main
from tests.missing_tools import skip_missing


@pytest.fixture(autouse=True)
def one_demo_at_a_time() -> Iterator[None]:
    """A demo uses Redis database 9 and a fixed host name: two at once (xdist workers, or two
    test sessions on one machine) would flush each other's data and see each other's
    processes. An flock makes them take turns."""
    with open(Path(tempfile.gettempdir(), "gpuci-test-demo.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def demo_processes() -> set[int]:
    """Processes the demo started (events, scheduler, worker and its pool, test runs): they
    carry the demo host's name in their environment."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"GPUCI_HOST=demo-gpu-01\0" in environ:
            found.add(int(entry.name))
    return found


def test_demo_plays_the_story_and_cleans_up(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert demo_processes() == set()
    assert main(["demo", "--once"]) == 0
    out = capsys.readouterr().out
    for scene in ("== 1.", "== 2.", "== 3.", "== 4.", "== 5.", "== 6.", "== 7."):
        assert scene in out
    # a maintainer's PR runs layer 2; the XPASS and skip reasons are shown as GitHub would
    assert "gpuci / batch 1: SUCCESS" in out
    assert "1 test marked xfail now passes: remove the marker" in out
    assert "needs FlashAttention-2" in out
    assert "gpuci / batch 2: FAILURE - 1 failed, 2 passed, 1 error" in out
    # the fork waits, is approved by label, and a push voids the approval
    assert "action_required, 'Approval needed before GPU runs'" in out
    assert "label gpuci/approved removed" in out
    # `/gpuci run batch 4 8`: batch 4 runs on idle GPUs, where its tests' hardware gates skip
    # every test: neutral, not validated, with the skip reasons grouped
    neutral = "gpuci / batch 4: NEUTRAL - Not validated: 0 passed, 4 skipped\n"
    assert out.index("== 5.") < out.index(neutral)
    assert "### Skipped (4)" in out
    assert re.search(  # grouped; what the gates saw: no driver, or fewer than 4 GPUs
        r"\| needs 4 GPUs with peer-to-peer links; (?P<seen>[^|\n]+) \| 2 \|\n"
        r"\| needs 4 Hopper GPUs \(compute capability 9\.0\) for FlashAttention-3; "
        r"(?P=seen) \| 2 \|\n",
        out,
    )
    # the 8-GPU batch waits with its reason, then runs once the foreign process leaves
    assert "waiting for 8 idle GPUs; largest idle set: 7 on demo-gpu-01" in out
    assert "gpuci / batch 8: FAILURE - 1 failed, 6 passed, 1 error" in out
    assert "The dashboard: http://127.0.0.1:" in out
    assert demo_processes() == set()
    # the fork's hostile tests run sandboxed: each attack's skip reason says what held
    hostile = out[out.index("== 6.") : out.index("== 7.")]
    if shutil.which("bwrap") is None:
        assert "skipped: bubblewrap is not installed" in hostile
        skip_missing("bubblewrap is not installed, so demo scene 6 did not run")
    assert "gpuci / batch cpu: SUCCESS - 3 passed, 3 skipped" in hostile
    assert "sandbox held: the base environment is read-only (Read-only file system)" in hostile
    assert re.search(r"sandbox held: \d+ processes visible, all the run's own", hostile)
    assert "after the run: 0 of its processes alive, the worker's Python environment unchanged" in (
        hostile
    )
    assert "| sandbox | bubblewrap |" in hostile and "| installer | uv |" in hostile
    # and the next run of that batch is clean: its own three tests, nothing else
    assert "gpuci / batch cpu: SUCCESS - 3 passed\n" in out[out.index("== 7.") :]


def test_ctrl_c_while_serving_stops_everything(redis_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "REDIS_URL": redis_url}
    demo = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "demo"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if "Serving until Ctrl-C" in line:
                break
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo_processes() == set()


def start_demo(redis_url: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "demo", "--once"],
        cwd=cwd,
        env={**os.environ, "REDIS_URL": redis_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(demo: subprocess.Popen[str], text: str) -> None:
    assert demo.stdout is not None
    for line in demo.stdout:
        if text in line:
            return
    raise AssertionError(f"the demo ended without printing {text!r}")


def test_a_second_demo_waits_its_turn_and_sigterm_stops_each(
    redis_url: str, tmp_path: Path
) -> None:
    """Two demos on one machine would share database 9 and take each other's tickets: the
    second waits, saying so. `kill` (SIGTERM) stops a demo and every process it started."""
    first = start_demo(redis_url, tmp_path)
    second = None
    try:
        read_until(first, "== 1.")
        second = start_demo(redis_url, tmp_path)
        read_until(second, "another demo is using redis://127.0.0.1:")
        second.terminate()
        assert second.wait(timeout=30) == 128 + signal.SIGTERM
        first.terminate()
        assert first.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        for demo in (first, second):
            if demo is not None and demo.poll() is None:
                demo.kill()
    assert demo_processes() == set()
