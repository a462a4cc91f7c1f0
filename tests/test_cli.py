"""The `gpuci` CLI end to end: real Redis, real pytest runs of the sample repo, simulated GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis import Redis

from bot.cli import main
from contract import leases
from tests.conftest import SAMPLE_REPO

HOST = "test-gpu-01"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str) -> Path:
    """A clean environment: simulated 8-GPU host, the tests' Redis, runs under tmp_path."""
    monkeypatch.chdir(tmp_path)
    for name in ("GPUCI_WEBHOOK_SECRET", "GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("GPUCI_GPU_BACKEND", "sim:8xH20-96GB")
    monkeypatch.setenv("GPUCI_HOST", HOST)
    monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("GPUCI_IDLE_SAMPLE_INTERVAL_S", "0")
    monkeypatch.setenv("GPUCI_KILL_GRACE_S", "1")
    return tmp_path


def run_batch(env: Path, name: str) -> tuple[int, dict]:
    out = env / f"{name}.json"
    code = main(
        ["run-batch", name, "--source", str(SAMPLE_REPO), "--sha", "a" * 40, "--json", str(out)]
    )
    return code, json.loads(out.read_text()) if out.exists() else {}


# What pytest itself reports for each sample batch (see examples/sample-repo/tests).
SAMPLE_OUTCOMES = {
    "cpu": (0, "success", dict(passed=3, failed=0, errors=0, skipped=0, xfailed=0, xpassed=0)),
    "1": (0, "success", dict(passed=3, failed=0, errors=0, skipped=1, xfailed=1, xpassed=1)),
    "2": (1, "failure", dict(passed=2, failed=1, errors=1, skipped=0, xfailed=0, xpassed=0)),
    "4": (0, "neutral", dict(passed=0, failed=0, errors=0, skipped=4, xfailed=0, xpassed=0)),
    "8": (1, "failure", dict(passed=6, failed=1, errors=1, skipped=0, xfailed=0, xpassed=0)),
}


@pytest.mark.parametrize("name", list(SAMPLE_OUTCOMES))
def test_run_batch_reports_what_pytest_saw(env: Path, redis_conn: Redis, name: str) -> None:
    code, expected_conclusion, counts = SAMPLE_OUTCOMES[name]
    exit_code, summary = run_batch(env, name)
    assert (exit_code, summary["conclusion"]) == (code, expected_conclusion)
    assert {k: summary[k] for k in counts} == counts
    assert summary["sha"] == "a" * 40
    assert summary["batch"] == name
    gpus = 0 if name == "cpu" else int(name)
    assert len(summary["gpus"]) == gpus
    assert all(g["name"] == "NVIDIA H20" for g in summary["gpus"])
    # the GPUs are released after the run
    assert all(v is None for v in leases.holders(redis_conn, HOST, range(8)).values())


def test_xpass_and_skip_reasons_are_reported(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, summary = run_batch(env, "1")
    assert summary["xpassed_tests"] == ["tests/test_single.py::test_bf16_overflow_fixed"]
    assert summary["skip_reasons"] == {"needs FlashAttention-2": 1}
    assert "now pass" in summary["title"]
    out = capsys.readouterr().out
    assert "remove the marker" in out
    assert "- tests/test_single.py::test_bf16_overflow_fixed" in out  # terminal: no md escapes


def test_nothing_passed_is_not_validated(env: Path) -> None:
    code, summary = run_batch(env, "4")
    assert code == 0
    assert summary["conclusion"] == "neutral"
    assert summary["title"].startswith("Not validated")


def test_busy_gpus_make_run_batch_explain_and_exit_2(
    env: Path, redis_conn: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    assert leases.acquire(redis_conn, HOST, [0, 1, 2], "someone-else", 60)
    code, _ = run_batch(env, "8")
    assert code == 2
    err = capsys.readouterr().err
    assert "needs 8 idle GPUs" in err
    assert "leased by" in err


def test_foreign_process_makes_gpu_busy(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = [{"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"} for _ in range(2)]
    gpus[1]["processes"] = [{"pid": 4242, "used_memory_mb": 30000, "name": "python"}]
    gpus[1]["memory_used_mb"] = 30000
    spec = env / "gpus.json"
    spec.write_text(json.dumps({"gpus": gpus}))
    monkeypatch.setenv("GPUCI_GPU_BACKEND", f"sim:{spec}")
    code, _ = run_batch(env, "2")
    assert code == 2
    assert "4242" in capsys.readouterr().err
    code, summary = run_batch(env, "1")
    assert code == 0
    assert [g["index"] for g in summary["gpus"]] == [0]


def test_unknown_batch_lists_valid_ones(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run_batch(env, "99")
    assert code == 2
    assert "unknown batch '99'" in capsys.readouterr().err


def test_cpu_batch_needs_no_nvml(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCI_GPU_BACKEND", "nvml")  # no NVML on this machine
    code, summary = run_batch(env, "cpu")
    assert (code, summary["conclusion"]) == (0, "success")


def test_gpus_without_nvml_exits_2_and_says_how_to_simulate(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("pynvml")
    monkeypatch.setenv("GPUCI_GPU_BACKEND", "nvml")
    try:
        import pynvml

        pynvml.nvmlInit()
        pytest.skip("this machine has a working NVML")
    except pynvml.NVMLError:
        pass
    assert main(["gpus"]) == 2
    err = capsys.readouterr().err
    assert "NVML" in err
    assert "sim:" in err


def test_gpus_json_is_a_hosts_inventory(
    env: Path, redis_conn: Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    assert leases.acquire(redis_conn, HOST, [3], "run-x:1", 60)
    assert main(["gpus", "--json"]) == 0
    inventory = json.loads(capsys.readouterr().out)
    gpus = inventory[HOST]
    assert len(gpus) == 8
    assert gpus[0]["idle"] is True
    assert gpus[3]["idle"] is False
    hosts = env / "hosts.json"
    hosts.write_text(json.dumps(inventory))
    assert main(["config", "check", str(SAMPLE_REPO / ".gpuci.yml"), "--hosts", str(hosts)]) == 0


def test_config_check_reports_located_errors(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = env / ".gpuci.yml"
    bad.write_text("version: 1\nbatches:\n  '2': {gpus: 2, tests: [t], timout: 5m}\n")
    assert main(["config", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:3:" in out
    assert "did you mean 'timeout'" in out


def test_config_check_with_small_hosts(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = env / "hosts.json"
    one = {"name": "NVIDIA T4", "memory_gb": 16, "compute_capability": "7.5"}
    hosts.write_text(json.dumps({"t4-01": [one]}))
    assert main(["config", "check", str(SAMPLE_REPO / ".gpuci.yml"), "--hosts", str(hosts)]) == 1
    out = capsys.readouterr().out
    assert "batch 2 needs 2 GPUs; the largest host, t4-01, has 1" in out


BAD_CONFIG = """\
version: 1
batches:
  "2": {gpus: 16, tests: [tests], timout: 40m}
layers:
  "2": {batches: ["7"], trigger: pull_request}
"""


def test_config_check_lists_config_and_host_problems_at_once(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gpus", "--json"]) == 0  # this host: 8 simulated H20s
    (env / "hosts.json").write_text(capsys.readouterr().out)
    (env / "bad.yml").write_text(BAD_CONFIG)

    assert main(["config", "check", "bad.yml", "--hosts", "hosts.json"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "bad.yml:3: batches.2.timout: unknown key 'timout'; did you mean 'timeout'?",
        f"bad.yml:3: batches.2: batch 2 needs 16 GPUs; the largest host, {HOST}, has 8",
        "bad.yml:5: layers.2.batches[0]: layer 2 names batch 7, which is not defined; "
        "defined batches: 2",
    ]
    assert err == "3 problem(s) in bad.yml\n"


def test_config_check_reports_a_broken_inventory_with_the_config(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (env / "hosts.json").write_text('{"h20-01": [{"name": "NVIDIA H20", "memory_gb": 96}]}')
    (env / "bad.yml").write_text(BAD_CONFIG)

    assert main(["config", "check", "bad.yml", "--hosts", "hosts.json"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "bad.yml:3: batches.2.timout: unknown key 'timout'; did you mean 'timeout'?",
        "bad.yml:5: layers.2.batches[0]: layer 2 names batch 7, which is not defined; "
        "defined batches: 2",
        'hosts.json:1: h20-01[0]: each GPU needs "compute_capability", e.g. "9.0"',
    ]
    assert err == "3 problem(s) in bad.yml and hosts.json\n"


def test_summarize_existing_junit(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junit = env / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest" tests="2" time="0.5">'
        '<testcase classname="tests.test_a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.test_a" name="test_skip" time="0.0">'
        '<skipped type="pytest.skip" message="needs bf16">needs bf16</skipped></testcase>'
        "</testsuite></testsuites>"
    )
    out = env / "summary.json"
    assert main(["summarize", str(junit), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert (data["passed"], data["skipped"], data["conclusion"]) == (1, 1, "success")
    assert data["skip_reasons"] == {"needs bf16": 1}


def test_summarize_refuses_hostile_xml(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junit = env / "evil.xml"
    junit.write_text(
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
        "<testsuite><testcase name='a'>&e;</testcase></testsuite>"
    )
    assert main(["summarize", str(junit)]) == 2
    assert "evil.xml" in capsys.readouterr().err


def test_pytest_usage_error_is_a_failure_with_the_log(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = env / "repo"
    (source / "tests").mkdir(parents=True)
    (source / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (source / ".gpuci.yml").write_text(
        "version: 1\nbatches:\n  bad: {gpus: 0, tests: [tests], pytest_args: [--no-such-flag]}\n"
    )
    out = env / "bad.json"
    code = main(["run-batch", "bad", "--source", str(source), "--json", str(out)])
    assert code == 1
    summary = json.loads(out.read_text())
    assert summary["conclusion"] == "failure"
    assert "bad command line" in summary["title"]
    assert "--no-such-flag" in capsys.readouterr().out  # the log tail is shown
