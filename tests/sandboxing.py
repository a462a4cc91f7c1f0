"""Fixtures and helpers for tests of sandboxed runs: bubblewrap, a base environment made
without a network, local wheels, and run requests layered on that base."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contract.config import Batch, Config, Runtime
from tests.missing_tools import skip_missing
from tests.packages import module_wheel
from workers import sandbox
from workers.runner import Environment, RunOutcome, RunRequest

HERE_SITE = next(p for p in sys.path if p.endswith("site-packages"))  # the worker's packages


@pytest.fixture(scope="session")
def bwrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        skip_missing("bubblewrap is not installed: apt-get install -y bubblewrap")
    host = sandbox.SandboxHost(found)
    sandbox.probe(host)
    return found


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """basepkg 1.0 (in the base) and 2.0 (what a PR installs), without a network."""
    directory = tmp_path_factory.mktemp("wheels")
    module_wheel(directory, "basepkg", "1.0")
    module_wheel(directory, "basepkg", "2.0")
    return directory


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    """A base environment as a host prepares one: its own packages (basepkg 1.0), and pytest
    from the worker's environment (a .pth, as no download is allowed)."""
    root = tmp_path_factory.mktemp("base") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "worker.pth").write_text(HERE_SITE + "\n")
    wheel = wheels / "basepkg-1.0-py3-none-any.whl"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
    )
    return root / "bin" / "python"


def base_site(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python*/site-packages"))


def tree_digest(root: Path) -> str:
    """Every path, mode and content under `root`: any change shows."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}:{info.st_mode}".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def request(
    tmp_path: Path,
    source: Path,
    base: Path,
    *,
    bwrap: str | None,
    runtime: Runtime | None = None,
    env: dict[str, str] | None = None,
    uv: str | None = None,
    read_only: tuple[Path, ...] = (),
    **changes: Any,
) -> RunRequest:
    runtime = runtime or Runtime("default")
    batch = Batch(name="2", gpus=0, tests=("tests",), timeout_s=60, env=env or {})
    config = Config(
        version=1,
        batches={"2": batch},
        runtimes={runtime.name: runtime},
        default_runtime=runtime.name,
        env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    made = RunRequest(
        run_id="run-1",
        batch=batch,
        config=config,
        source=source,
        gpu_indices=(),
        work_root=tmp_path / "work",
        kill_grace_s=1.0,
        load_report_plugin=False,
        environment=Environment(str(base), "test-base", uv),
        sandbox=sandbox.SandboxHost(bwrap, read_only=tuple(map(str, read_only))) if bwrap else None,
    )
    return replace(made, **changes)


def repo(root: Path, tests: dict[str, str]) -> Path:
    for name, code in tests.items():
        path = root / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return root


def junit_counts(outcome: RunOutcome) -> tuple[int, int]:
    """(tests, failures) from the run's JUnit file."""
    assert outcome.junit_path is not None, outcome.log_tail
    text = outcome.junit_path.read_text()
    tests = int(text.split('tests="')[1].split('"')[0])
    failures = int(text.split('failures="')[1].split('"')[0])
    return tests, failures


def marked_processes(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# --- a hostile test, and what it gets ----------------------------------------------------------
