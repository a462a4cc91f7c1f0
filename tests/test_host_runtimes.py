"""A GPU host's runtimes file, its settings for sandboxing, caches and disk, and how the worker
starts with them: located errors, an explicit setting to run unsandboxed, a warning when so."""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
from pathlib import Path

import pytest

from contract.config import Runtime
from contract.settings import Settings, SettingsError
from tests.conftest import ROOT
from workers.hostsetup import HostSetup, HostSetupError, RuntimeUnavailable
from workers.runtimes import HostRuntimes, RuntimesError, load_host_runtimes

PYTHON = sys.executable


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "runtimes.yml"
    path.write_text(text)
    return str(path)


def test_without_a_file_the_only_base_is_the_workers_python() -> None:
    runtimes = load_host_runtimes("", PYTHON)

    assert runtimes == HostRuntimes({"default": PYTHON})
    assert runtimes.provides() == ["base:default"]


def test_a_file_declares_bases_and_an_engine(tmp_path: Path) -> None:
    engine = next((e for e in ("podman", "docker") if shutil.which(e)), None)
    text = f"bases:\n  torch2.13-cu13.0: {PYTHON}\n" + (f"engine: {engine}\n" if engine else "")

    runtimes = load_host_runtimes(write(tmp_path, text), PYTHON)

    assert runtimes.bases == {"default": PYTHON, "torch2.13-cu13.0": PYTHON}
    image = ["image"] if engine else []
    assert runtimes.provides() == ["base:default", "base:torch2.13-cu13.0", *image]
    assert runtimes.base_python(Runtime("t", base="torch2.13-cu13.0")) == PYTHON
    assert runtimes.base_python(Runtime("t", base="other")) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bases: [a]\n", "bases must map a name to its interpreter"),
        ("bases:\n  t: bin/python\n", "bases.t: give the absolute path of the base's python"),
        ("bases:\n  t: /nonexistent/python\n", "bases.t: /nonexistent/python is not an executable"),
        ("engine: lxc\n", "engine 'lxc' is not podman, docker or none"),
        ("basis: {}\n", "unknown key 'basis'; keys are bases, engine, gpu_devices"),
        ("bases: {t: [\n", "not valid YAML"),
        ("- 1\n", "expected a mapping with bases: and engine:"),
        ("gpu_devices: all\n", "gpu_devices 'all' is not cdi or gpus"),
    ],
)
def test_each_problem_of_the_file_names_it(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)

    with pytest.raises(RuntimesError, match=re.escape(message)) as raised:
        load_host_runtimes(path, PYTHON)
    assert str(raised.value).startswith(path)


def test_a_missing_file_says_so() -> None:
    with pytest.raises(RuntimesError, match="cannot read the runtimes file"):
        load_host_runtimes("/nonexistent/runtimes.yml", PYTHON)


def settings(tmp_path: Path, **changes: str) -> Settings:
    found = Settings.from_env({"GPUCI_WORK_DIR": str(tmp_path / "runs"), **changes}, dotenv=None)
    return found


def test_running_unsandboxed_is_explicit_and_warned(tmp_path: Path) -> None:
    setup = HostSetup.from_settings(settings(tmp_path, GPUCI_SANDBOX="none"))

    assert setup.sandbox is None
    assert any("runs are NOT sandboxed" in w for w in setup.warnings)


def test_an_unknown_sandbox_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HostSetupError, match="GPUCI_SANDBOX='off' is not one of auto"):
        HostSetup.from_settings(settings(tmp_path, GPUCI_SANDBOX="off"))


def test_without_bubblewrap_the_worker_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a host where bwrap is not installed

    with pytest.raises(HostSetupError) as refused:
        HostSetup.from_settings(settings(tmp_path))

    assert "apt-get install -y bubblewrap" in str(refused.value)
    assert "or set GPUCI_SANDBOX=none" in str(refused.value)


def test_with_bubblewrap_runs_are_sandboxed_by_default(tmp_path: Path, bwrap: str) -> None:
    setup = HostSetup.from_settings(settings(tmp_path))

    assert setup.sandbox is not None and setup.sandbox.bwrap == bwrap
    assert setup.describe().startswith("sandbox bubblewrap")


def test_a_run_whose_base_the_host_lacks_is_sent_elsewhere(tmp_path: Path) -> None:
    setup = HostSetup.from_settings(settings(tmp_path, GPUCI_SANDBOX="none"))

    with pytest.raises(
        RuntimeUnavailable, match=r"does not provide base torch2\.13 \(runtime torch\)"
    ):
        setup.request_parts(Runtime("torch", base="torch2.13"), "acme/gpu", True)
    with pytest.raises(RuntimeUnavailable, match="needs a container engine"):
        setup.request_parts(Runtime("trl", image="pytorch/pytorch"), "acme/gpu", True)
    parts = setup.request_parts(Runtime("default"), "acme/gpu", False)
    assert parts["environment"].base_python == PYTHON
    assert parts["caches"].trusted is False and parts["caches"].repo == "acme/gpu"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GPUCI_CACHE_MAX_SIZE", "20", "GPUCI_CACHE_MAX_SIZE: '20' is not a size"),
        ("GPUCI_MIN_FREE_DISK", "lots", "GPUCI_MIN_FREE_DISK: 'lots' is not a size"),
        ("GPUCI_KEEP_FAILED_RUNS", "a day", "GPUCI_KEEP_FAILED_RUNS: 'a day' is not a duration"),
    ],
)
def test_sizes_and_durations_are_checked_at_start(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        settings(tmp_path, **{name: value})


def test_every_setting_is_in_env_example_with_a_comment() -> None:
    lines = (ROOT / ".env.example").read_text().splitlines()
    names = {line.split("=", 1)[0] for line in lines if re.match(r"[A-Z_]+=", line)}
    expected = {
        "REDIS_URL" if f.name == "redis_url" else "GPUCI_" + f.name.upper()
        for f in dataclasses.fields(Settings)
    }
    assert names == expected
    for index, line in enumerate(lines):
        if re.match(r"[A-Z_]+=", line):
            above = lines[index - 1]
            assert above.startswith("#") or re.match(r"[A-Z_]+=", above), line
