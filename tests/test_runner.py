"""Running a batch: real pytest runs in fresh directories, scrubbed environments, no survivors."""

from __future__ import annotations

import ctypes
import os
import pwd
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contract.config import Batch, Config, Runtime
from workers import procs
from workers.runner import (
    PLUGIN_DIR,
    RunnerError,
    RunOutcome,
    RunRequest,
    build_pytest_command,
    resolve_workers,
    run_batch,
    test_environment,
)

PASSING = "def test_one():\n    assert True\n\ndef test_two():\n    assert 1 + 1 == 2\n"


def _repo(root: Path, tests: dict[str, str]) -> Path:
    for name, code in tests.items():
        path = root / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return root


def _request(tmp_path: Path, source: Path, **changes: Any) -> RunRequest:
    batch = Batch(name="2", gpus=0, tests=("tests",), timeout_s=30, env={"OUT": str(tmp_path)})
    # Without the venv's other plugins (coverage, hypothesis...) a child pytest starts 4x faster.
    config = Config(version=1, batches={"2": batch}, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    request = RunRequest(
        run_id="run-1",
        batch=batch,
        config=config,
        source=source,
        gpu_indices=(),
        work_root=tmp_path / "work",
        kill_grace_s=1.0,
        load_report_plugin=False,
    )
    return replace(request, **changes)


def with_setup(config: Config, *commands: str) -> Config:
    """The config with these setup commands in its default runtime."""
    return replace(config, runtimes={"default": Runtime("default", setup=commands)})


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in "ZX"


def test_passing_run_runs_setup_in_the_sources_then_writes_junit(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_ok.py": "from generated import VALUE\n" + PASSING})
    request = _request(tmp_path, source)
    config = with_setup(request.config, "echo 'VALUE = 7' > generated.py")

    outcome = run_batch(replace(request, config=config))

    assert outcome.exit_code == 0
    assert not (outcome.timed_out or outcome.cancelled or outcome.setup_failed)
    assert outcome.preflight_error is None
    assert outcome.junit_path == outcome.workdir / "junit.xml"
    assert 'tests="2"' in outcome.junit_path.read_text()
    assert "2 passed" in outcome.log_tail
    assert not outcome.log_truncated
    assert outcome.killed_pids == []


def test_failing_test_gives_pytest_exit_status(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_bad.py": "def test_bad():\n    assert 1 == 2\n"})

    outcome = run_batch(_request(tmp_path, source))

    assert outcome.exit_code == 1
    assert not outcome.setup_failed
    assert "1 failed" in outcome.log_tail
    assert outcome.junit_path is not None


def test_failing_setup_command_stops_the_run_and_shows_its_output(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_ok.py": PASSING})
    request = _request(tmp_path, source)
    setup = ("echo preparing", "echo 'no such package: torch' >&2; exit 3", "echo never")

    outcome = run_batch(replace(request, config=with_setup(request.config, *setup)))

    assert outcome.setup_failed
    assert outcome.exit_code is None
    assert outcome.junit_path is None
    assert "preparing" in outcome.log_tail
    assert "no such package: torch" in outcome.log_tail
    assert "exited with status 3" in outcome.log_tail
    assert "never" not in outcome.log_path.read_text().replace("echo never", "")


ENV_CHECK = """\
import os

def test_environment_is_scrubbed():
    for name in ("GPUCI_WEBHOOK_SECRET", "REDIS_URL", "GITHUB_TOKEN", "MY_API_TOKEN"):
        assert name not in os.environ, name
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,3"
    assert os.environ["LANG"] == "C.UTF-8"
    assert os.environ["FROM_CONFIG"] == "config" and os.environ["FROM_BATCH"] == "batch"
    assert os.environ["TMPDIR"].startswith(os.path.dirname(os.getcwd()))
    assert len(os.environ["GPUCI_RUN_TOKEN"]) >= 16
"""


def test_tests_see_a_scrubbed_environment_and_the_leased_gpus(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_env.py": ENV_CHECK})
    base = {
        "PATH": os.environ["PATH"],
        "LANG": "C.UTF-8",
        "GPUCI_WEBHOOK_SECRET": "hush",
        "REDIS_URL": "redis://10.0.0.5:6379/0",
        "GITHUB_TOKEN": "ghs_abcdefghijklmnopqrstuvwxyz0123",
        "MY_API_TOKEN": "sk-123",
    }
    request = _request(tmp_path, source, gpu_indices=(0, 3), simulated_gpus=True, environ=base)
    batch = replace(request.batch, gpus=2, env={"FROM_BATCH": "batch"})
    config_env = {**request.config.env, "FROM_CONFIG": "config", "FROM_BATCH": "config"}
    config = replace(request.config, env=config_env)

    outcome = run_batch(replace(request, batch=batch, config=config))

    assert outcome.exit_code == 0, outcome.log_tail
    assert "1 passed" in outcome.log_tail


SECRET_NAMES = [
    "GPUCI_WEBHOOK_SECRET", "GPUCI_REDIS_URL", "REDIS_URL", "GITHUB_TOKEN", "GH_TOKEN",
    "HF_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "AWS_ACCESS_KEY_ID", "DB_PASSWORD",
    "GOOGLE_APPLICATION_CREDENTIALS", "SSH_AUTH_SOCK", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
]  # fmt: skip
KEPT_NAMES = ["PATH", "HOME", "LANG", "LC_ALL", "USER", "SHELL", "TERM", "VIRTUAL_ENV"]


def _env(base: dict[str, str], **changes: Any) -> dict[str, str]:
    batch = Batch(name="2", gpus=1, tests=("tests",))
    arguments: dict[str, Any] = {
        "config": Config(version=1, batches={"2": batch}),
        "batch": batch,
        "gpu_indices": (5,),
        "token": "t0k3n",
        "plugin_dir": Path("/opt/gpuci/plugin"),
        **changes,
    }
    return test_environment(base, **arguments)


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_environment_drops_credentials_and_worker_settings(name: str) -> None:
    assert name not in _env({name: "value", "PATH": "/usr/bin"})


@pytest.mark.parametrize("name", KEPT_NAMES)
def test_environment_keeps_ordinary_variables(name: str) -> None:
    assert _env({name: "value"})[name] == "value"


def test_environment_drops_any_variable_holding_a_url_with_a_password() -> None:
    env = _env({"PIP_INDEX_URL": "https://bot:hunter2@pypi.example/simple", "MIRROR": "https://x/"})

    assert "PIP_INDEX_URL" not in env
    assert env["MIRROR"] == "https://x/"


def test_environment_sets_marker_gpus_and_plugin_path_last() -> None:
    batch = Batch(name="2", gpus=1, tests=("tests",), env={"PYTHONPATH": "src"})
    hostile = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "GPUCI_RUN_TOKEN": "other"}
    config = Config(version=1, batches={"2": batch}, env=hostile)

    env = _env({"PYTHONPATH": "/worker"}, config=config, batch=batch, tmpdir=Path("/w/tmp"))

    assert env["CUDA_VISIBLE_DEVICES"] == "5"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUCI_RUN_TOKEN"] == "t0k3n"
    assert env["PYTHONPATH"] == os.pathsep.join(["/opt/gpuci/plugin", "src"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["TMPDIR"] == "/w/tmp"


def test_cpu_batch_sees_no_gpu() -> None:
    env = _env({"CUDA_VISIBLE_DEVICES": "0"}, gpu_indices=(), plugin_dir=None)

    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "PYTHONPATH" not in env


HANGS = """\
import os, signal, subprocess, time
from pathlib import Path

def test_hangs():
    out = Path(os.environ["OUT"])
    daemon = subprocess.Popen(["setsid", "bash", "-c", "trap '' TERM; sleep 600"])
    (out / "daemon.pid").write_text(str(daemon.pid))
    (out / "token").write_text(os.environ["GPUCI_RUN_TOKEN"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
"""


def test_timeout_kills_the_group_and_processes_that_left_it(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_hangs.py": HANGS})
    request = _request(tmp_path, source, timeout_s=3, kill_grace_s=1.0)

    outcome = run_batch(request)

    assert outcome.timed_out and not outcome.cancelled
    assert outcome.exit_code is None
    assert outcome.duration_s < 3 + 1 + 4
    assert "timed out after 3s" in outcome.log_tail
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert daemon in outcome.killed_pids
    assert not _alive(daemon)
    assert procs.marked_pids((tmp_path / "token").read_text()) == set()


WAITS = """\
import os, time
from pathlib import Path

def test_waits():
    Path(os.environ["OUT"], "started").write_text(os.environ["GPUCI_RUN_TOKEN"])
    time.sleep(600)
"""


@pytest.fixture
def foreign_gpu_process() -> Iterator[subprocess.Popen[bytes]]:
    """A compute process on the run's GPUs that does not carry the run's marker."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_cancel_stops_the_run_and_the_processes_on_its_gpus(
    tmp_path: Path, foreign_gpu_process: subprocess.Popen[bytes]
) -> None:
    source = _repo(tmp_path / "repo", {"test_waits.py": WAITS})
    cancel = threading.Event()
    result: list[RunOutcome] = []
    # Our own pid among the GPU's processes must never be killed.
    gpu_pids = lambda: [foreign_gpu_process.pid, os.getpid()]  # noqa: E731
    runner = threading.Thread(
        target=lambda: result.append(run_batch(_request(tmp_path, source), cancel, gpu_pids))
    )
    runner.start()
    _wait_for(tmp_path / "started")
    cancelled_at = time.monotonic()
    cancel.set()
    runner.join(timeout=10)

    outcome = result[0]
    assert outcome.cancelled and not outcome.timed_out
    assert time.monotonic() - cancelled_at < 1.0 + 3
    assert foreign_gpu_process.wait(timeout=5) == -9
    assert foreign_gpu_process.pid in outcome.killed_pids
    assert os.getpid() not in outcome.killed_pids
    assert procs.marked_pids((tmp_path / "started").read_text()) == set()


def _wait_for(path: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


DAEMON = """\
import os, subprocess
from pathlib import Path

def test_leaves_a_daemon():
    daemon = subprocess.Popen(["setsid", "sleep", "600"])
    Path(os.environ["OUT"], "daemon.pid").write_text(str(daemon.pid))
"""


def test_daemon_left_by_a_finished_run_is_killed(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_daemon.py": DAEMON})

    outcome = run_batch(_request(tmp_path, source))

    assert outcome.exit_code == 0
    daemon = int((tmp_path / "daemon.pid").read_text())
    assert outcome.killed_pids == [daemon]
    assert not _alive(daemon)


LOUD = """\
import sys

def test_loud():
    sys.stdout.write("HEAD-MARK\\n" + ("x" * 99 + "\\n") * 20_000 + "TAIL-MARK\\n")
"""


def test_log_keeps_head_and_tail_within_its_cap(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_loud.py": LOUD})
    request = _request(tmp_path, source, log_max_bytes=64 * 1024)
    batch = replace(request.batch, pytest_args=("-s",))

    outcome = run_batch(replace(request, batch=batch))

    assert outcome.exit_code == 0
    assert outcome.log_truncated
    log = outcome.log_path.read_text()
    assert outcome.log_path.stat().st_size <= 64 * 1024 + len("\n[... 9999999 bytes omitted ...]\n")
    assert log.index("HEAD-MARK") < log.index("bytes omitted ...]") < log.index("TAIL-MARK")
    assert "1 passed" in outcome.log_tail
    assert len(outcome.log_tail.splitlines()) <= 80


def test_each_run_gets_a_fresh_directory_without_vcs_or_caches(tmp_path: Path) -> None:
    litter = (
        "import os\n\ndef test_fresh():\n    assert not os.path.exists('litter.txt')\n"
        "    assert not os.path.exists('.git') and not os.path.exists('__pycache__')\n"
        "    open('litter.txt', 'w').close()\n"
    )
    source = _repo(tmp_path / "repo", {"test_fresh.py": litter})
    (source / ".git").mkdir()
    (source / "__pycache__").mkdir()
    request = _request(tmp_path, source, run_id="pr-7/batch 2")

    first, second = run_batch(request), run_batch(request)

    assert first.exit_code == second.exit_code == 0
    assert first.workdir != second.workdir
    for outcome in (first, second):
        assert outcome.workdir.parent == tmp_path / "work"
        assert outcome.workdir.name.startswith("pr-7_batch_2-")


def test_sources_can_come_from_a_github_tarball(tmp_path: Path) -> None:
    source = _repo(tmp_path / "octo-repo-abc123", {"test_ok.py": PASSING})
    archive = tmp_path / "source.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=source.name)

    outcome = run_batch(_request(tmp_path, archive))

    assert outcome.exit_code == 0
    assert "2 passed" in outcome.log_tail


def test_hostile_tarball_fails_setup_naming_the_entry(tmp_path: Path) -> None:
    archive = tmp_path / "source.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(tarfile.TarInfo("../escape.py"))  # path-check: hostile input

    outcome = run_batch(_request(tmp_path, archive))

    assert outcome.setup_failed
    assert "'../escape.py'" in outcome.log_tail  # path-check: hostile input
    assert outcome.junit_path is None
    assert not (tmp_path / "work" / "escape.py").exists()


def test_preflight_refuses_a_batch_that_would_see_fewer_gpus(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_ok.py": PASSING})
    request = _request(tmp_path, source, gpu_indices=(0,))

    outcome = run_batch(replace(request, batch=replace(request.batch, name="10", gpus=2)))

    assert outcome.preflight_error is not None
    assert outcome.preflight_error.startswith("tests would see ")
    assert outcome.preflight_error.endswith(" GPUs, batch 10 needs 2")
    assert outcome.exit_code is None
    assert outcome.junit_path is None
    assert "pytest not run" in outcome.log_tail


def _cuda_devices() -> int:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    ok = cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    return count.value if ok else 0


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_devices() < 1, reason="needs a CUDA GPU")
def test_preflight_passes_on_a_real_gpu(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_ok.py": PASSING})
    request = _request(tmp_path, source, gpu_indices=(0,))

    outcome = run_batch(replace(request, batch=replace(request.batch, gpus=1)))

    assert outcome.preflight_error is None, outcome.log_tail
    assert outcome.exit_code == 0
    assert "CUDA sees 1 device(s)" in outcome.log_path.read_text()


def test_pytest_command_line() -> None:
    batch = Batch(name="10", gpus=8, tests=("tests/a", "tests/b"), markers="largedist")
    batch = replace(batch, pytest_args=("-x",))
    config = Config(version=1, batches={"10": batch}, pytest_args=("-ra",))
    junit, report = Path("/w/junit.xml"), Path("/w/report.jsonl")

    command = build_pytest_command(
        "/py", config, batch, workers=6, junit_path=junit, report_path=report
    )

    assert command == [
        "/py", "-m", "pytest", "-ra", "-x", "-m", "largedist", "-n", "6",
        "--junitxml=/w/junit.xml", "-o", "junit_family=xunit1",
        "-p", "gpuci_report", "--gpuci-report=/w/report.jsonl", "tests/a", "tests/b",
    ]  # fmt: skip


def test_pytest_command_without_workers_or_report_plugin() -> None:
    batch = Batch(name="2", gpus=1, tests=("tests",))
    config = Config(version=1, batches={"2": batch})

    command = build_pytest_command(
        "/py", config, batch, workers=None, junit_path=Path("/w/j.xml"), report_path=None
    )

    assert "-n" not in command and "-p" not in command and "-m" not in command[3:]
    assert command[-1] == "tests"


@pytest.mark.parametrize(
    "workers, per_worker, free, expected",
    [
        (None, None, [80_000], None),
        (3, None, [80_000], 3),
        ("auto", 6_144, [80_000], 13),  # 80000 // 6144
        ("auto", 6_144, [80_000, 20_000], 16),  # 13 + 3
        ("auto", 6_144, [1_000, 2_000], 1),  # never fewer than one worker
        ("auto", None, [80_000, 80_000], 2),  # no per-worker size: one per GPU
        ("auto", 6_144, [], 1),
    ],
)
def test_resolve_workers(
    workers: Any, per_worker: int | None, free: list[int], expected: int | None
) -> None:
    batch = Batch(name="10", gpus=len(free), tests=("t",), workers=workers)
    batch = replace(batch, vram_per_worker_mb=per_worker)

    assert resolve_workers(batch, free) == expected


@pytest.mark.skipif(not (PLUGIN_DIR / "gpuci_report.py").exists(), reason="plugin not written yet")
def test_run_loads_the_report_plugin(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_ok.py": PASSING})
    request = _request(tmp_path, source, load_report_plugin=True, workers=2)
    batch = replace(request.batch, pytest_args=("-p", "xdist.plugin"))

    outcome = run_batch(replace(request, batch=batch))

    assert outcome.exit_code == 0, outcome.log_tail
    assert outcome.report_path == outcome.workdir / "report.jsonl"


def test_unknown_run_as_user_is_a_clear_error(tmp_path: Path) -> None:
    source = _repo(tmp_path / "repo", {"test_ok.py": PASSING})

    with pytest.raises(RunnerError, match="run_as user 'gpuci-nosuchuser' does not exist"):
        run_batch(_request(tmp_path, source, run_as="gpuci-nosuchuser"))


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


@pytest.mark.skipif(os.geteuid() != 0 or _nobody() is None, reason="needs root and 'nobody'")
def test_run_as_runs_children_as_that_user_in_a_directory_it_owns() -> None:
    work_root = Path(tempfile.mkdtemp(prefix="gpuci-runas-"))
    work_root.chmod(0o755)
    source = _repo(work_root / "repo", {"test_ok.py": PASSING})
    setup = ("echo I am $(id -un) in $HOME; touch made-by-setup",)
    # The venv's python may live where nobody cannot read it: a stand-in that exits 0.
    request = _request(work_root, source, run_as="nobody", python="/bin/true")

    outcome = run_batch(replace(request, config=with_setup(request.config, *setup)))

    assert not outcome.setup_failed, outcome.log_tail
    nobody = _nobody()
    assert nobody is not None
    box = outcome.workdir / "box"
    assert f"I am nobody in {box / 'home'}" in outcome.log_tail  # a fresh HOME of the run's own
    assert (box / "src" / "made-by-setup").stat().st_uid == nobody.pw_uid
    # The run directory, its log and the worker's copies of results stay the worker's.
    assert outcome.workdir.stat().st_uid == os.geteuid()
    assert outcome.workdir.stat().st_mode & 0o777 == 0o711
    assert outcome.log_path.stat().st_uid == os.geteuid()
    subprocess.run(["rm", "-rf", str(work_root)], check=True)


def test_process_cleanup_never_signals_our_own_group() -> None:
    with pytest.raises(ValueError, match="refusing to signal process group"):
        procs.kill_group(os.getpgrp(), 0)
