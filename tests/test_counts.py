"""Counts that match pytest's own line where they used to drift: subtests, a run stopped at its
deadline or by `os._exit`, reruns in plain JUnit, collection errors, a `gpus: 0` batch's
workers, foreign JUnit and a closed pipe. Every pytest case is a real pytest run; the foreign
JUnit files are written here, shaped like the EnricoMi corpus's."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import main
from contract.checks import Conclusion, judge
from contract.outcomes import Outcome
from contract.results import Failure, RunReport, Summary, count_line, repo_path
from tests.test_cli import env  # noqa: F401  (a fixture)
from workers.junit import parse_junit
from workers.outcomes import read_outcomes

ROOT = Path(__file__).resolve().parent.parent
F_SETPIPE_SZ = 1031  # Linux's fcntl to set a pipe's capacity
PLUGIN = ROOT / "workers" / "pytest_plugin"

SUBTESTS = """
import unittest
import pytest

class TestSub(unittest.TestCase):
    def test_passing(self):
        for i in range(3):
            with self.subTest(i=i):
                pass

    def test_failing(self):
        for i in range(5):
            with self.subTest(i=i):
                self.assertLess(i, 2)

def test_plain():
    pass

def test_fixture(subtests):
    for i in range(4):
        with subtests.test(msg="step", i=i):
            assert i != 3

def test_fixture_skips(subtests):
    with subtests.test(i=0):
        pytest.skip("needs 2 GPUs")
    with subtests.test(i=1):
        pass
"""

DEADLINE = """
import time

def test_1():
    pass

def test_2():
    assert 1 == 2, "completed before the deadline"

def test_3():
    time.sleep(120)

def test_4():
    pass
"""

EXITS = DEADLINE.replace("time.sleep(120)", "import os; os._exit(0)")

RERUNS = """
from pathlib import Path

def test_always():
    assert False, "fails every time"

def test_flaky():
    state = Path(__file__).with_name("attempts")
    tries = int(state.read_text()) if state.exists() else 0
    state.write_text(str(tries + 1))
    assert tries >= 1, "fails once"

def test_ok():
    pass
"""

BROKEN = "import gpuci_no_such_module  # noqa: F401\n\ndef test_never():\n    pass\n"
XDIST_ONLY = (
    "import os\n\ndef test_under_xdist():\n    assert os.environ.get('PYTEST_XDIST_WORKER')\n"
)


def project(root: Path, tests: dict[str, str], batches: str) -> Path:
    (root / "tests").mkdir(parents=True)
    for name, body in tests.items():
        (root / "tests" / name).write_text(body)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / ".gpuci.yml").write_text(f"version: 1\nbatches:\n{batches}")
    return root


def pytest_line(root: Path, *args: str) -> tuple[set[str], Path, Path]:
    """pytest's own `-q` summary line, as its parts, and the JUnit file and gpuci report."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    environ["PYTHONPATH"] = str(PLUGIN)
    junit, report = root / "junit.xml", root / "report.jsonl"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no"]
    command += ["-p", "gpuci_report", f"--gpuci-report={report}", f"--junitxml={junit}", *args]
    done = subprocess.run(
        command, cwd=root, env=environ, capture_output=True, text=True, timeout=120
    )
    last = done.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"(.+) in [\d.]+s(?: \(.*\))?", last)
    assert match, done.stdout + done.stderr
    return set(match.group(1).split(", ")), junit, report


def parts(line: str) -> set[str]:
    return set(line.split(", "))


def run_batch(root: Path, name: str) -> tuple[int, dict]:
    """`gpuci run-batch NAME` of the project: its exit status and its --json summary."""
    out = root.parent / f"{root.name}-{name}.json"
    code = main(["run-batch", name, "--source", str(root), "--json", str(out)])
    return code, json.loads(out.read_text())


# --- 1. subtests ----------------------------------------------------------------------------


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_subtests_are_counted_beside_tests_as_pytest_does(
    tmp_path: Path, xdist: tuple[str, ...]
) -> None:
    root = project(tmp_path, {"test_sub.py": SUBTESTS}, "")
    expected, junit, report = pytest_line(root, *xdist, "tests")
    summary = parse_junit([junit], report)
    assert parts(count_line(summary)) == expected
    assert summary.tests == 5  # test functions, not subtests
    assert (summary.subtests_passed, summary.subtests_failed, summary.subtests_skipped) == (
        9,
        4,
        1,
    )


def test_one_test_with_passing_subtests_is_one_passed_test(tmp_path: Path) -> None:
    body = "import unittest\nclass T(unittest.TestCase):\n    def test_it(self):\n"
    body += (
        "        for i in range(3):\n            with self.subTest(i=i):\n                pass\n"
    )
    root = project(tmp_path, {"test_one.py": body}, "")
    expected, junit, report = pytest_line(root, "tests")
    assert expected == {"1 passed", "3 subtests passed"}
    summary = parse_junit([junit], report)
    assert (summary.tests, summary.passed, count_line(summary)) == (
        1,
        1,
        "1 passed, 3 subtests passed",
    )


def test_a_run_with_subtests_reports_them_in_its_check_run(
    env: Path,  # noqa: F811
) -> None:
    root = project(env / "sub", {"test_sub.py": SUBTESTS}, "  cpu: {gpus: 0, tests: [tests]}\n")
    expected, _, _ = pytest_line(root, "tests")
    code, data = run_batch(root, "cpu")
    assert (code, data["conclusion"]) == (1, "failure")
    assert parts(data["title"]) == expected
    assert data["tests"] == 5 and data["subtests_passed"] == 9


# --- 2. a run stopped before pytest wrote its JUnit file ------------------------------------


@pytest.mark.parametrize("workers", ["", ", workers: 2"], ids=["plain", "xdist"])
def test_a_timed_out_run_reports_what_completed_and_what_was_running(
    env: Path,  # noqa: F811
    workers: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    batch = f"  slow: {{gpus: 0, tests: [tests], timeout: 8s{workers}}}\n"
    root = project(env / "slow", {"test_deadline.py": DEADLINE}, batch)
    code, data = run_batch(root, "slow")
    out = capsys.readouterr().out
    assert (code, data["conclusion"]) == (1, "timed_out")
    assert data["failed"] == 1 and data["passed"] >= 1
    assert data["title"].startswith(f"Timed out: 1 failed, {data['passed']} passed; running: ")
    assert "tests/test_deadline.py::test_3" in data["running"]
    (failure,) = data["failures"]
    assert (failure["test_id"], failure["file"]) == (
        "tests/test_deadline.py::test_2",
        "tests/test_deadline.py",
    )
    assert "completed before the deadline" in failure["message"]
    assert "### FAILURE tests/test_deadline.py::test_2 at tests/test_deadline.py:" in out
    assert "Running when the run stopped" in out


def test_a_run_that_exits_mid_way_keeps_its_completed_failure(
    env: Path,  # noqa: F811
) -> None:
    root = project(env / "exits", {"test_exit.py": EXITS}, "  cpu: {gpus: 0, tests: [tests]}\n")
    code, data = run_batch(root, "cpu")
    assert (code, data["conclusion"]) == (1, "failure")
    assert data["title"] == (
        "pytest exited with code 0 and wrote no JUnit report; completed: 1 failed, 1 passed;"
        " running: tests/test_exit.py::test_3"
    )
    assert [f["test_id"] for f in data["failures"]] == ["tests/test_exit.py::test_2"]


# --- 3. reruns in plain JUnit ---------------------------------------------------------------


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_summarize_without_report_counts_rerun_attempts_as_reruns(
    tmp_path: Path, xdist: tuple[str, ...]
) -> None:
    root = project(tmp_path, {"test_reruns.py": RERUNS}, "")
    expected, junit, _ = pytest_line(root, "--reruns", "2", *xdist, "tests")
    assert expected == {"1 failed", "2 passed", "3 rerun"}
    out = tmp_path / "summary.json"
    assert main(["summarize", str(junit), "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert parts(data["title"]) == expected
    assert (data["tests"], data["reruns"]) == (3, 3)


def test_the_same_test_in_two_suites_is_not_a_rerun(tmp_path: Path) -> None:
    case = '<testcase classname="tests.test_m" name="test_a" time="0.1"/>'
    path = tmp_path / "matrix.xml"
    path.write_text(
        f'<testsuites><testsuite name="py3.11">{case}</testsuite>'
        f'<testsuite name="py3.12">{case}</testsuite></testsuites>'
    )
    summary = parse_junit([path])
    assert (summary.tests, summary.passed, summary.reruns) == (2, 2, 0)


# --- 4. collection errors -------------------------------------------------------------------


def test_a_collection_error_is_an_error_with_its_module_and_traceback(
    env: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    tests = {"test_broken.py": BROKEN, "test_fine.py": "def test_fine():\n    pass\n"}
    root = project(env / "broken", tests, "  cpu: {gpus: 0, tests: [tests]}\n")
    expected, _, _ = pytest_line(root, "tests")
    code, data = run_batch(root, "cpu")
    assert expected == {"1 error"}
    assert (code, data["conclusion"], parts(data["title"])) == (1, "failure", expected)
    (failure,) = data["failures"]
    assert (failure["test_id"], failure["kind"], failure["file"], failure["line"]) == (
        "tests/test_broken.py",
        "error",
        "tests/test_broken.py",
        1,
    )
    assert "ModuleNotFoundError: No module named 'gpuci_no_such_module'" in capsys.readouterr().out


# --- 5. one code path for a worker and run-batch --------------------------------------------


def test_run_batch_runs_a_cpu_batch_with_its_workers(env: Path) -> None:  # noqa: F811
    batches = "  xd: {gpus: 0, tests: [tests], workers: 2}\n  one: {gpus: 0, tests: [tests]}\n"
    root = project(env / "workers", {"test_xdist.py": XDIST_ONLY}, batches)
    assert run_batch(root, "xd")[1]["title"] == "1 passed"
    assert run_batch(root, "one")[1]["title"] == "1 failed"


# --- 6. foreign JUnit -----------------------------------------------------------------------

MULTIRESULT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="multi" tests="4" failures="2" errors="2" skipped="3">
<testcase name="all three" classname="suite.Multi" file="file:///home/ci/src/suite/Multi.py">
  <skipped message="skipped"/><failure message="failed">trace</failure><error message="e">x</error>
</testcase>
<testcase name="error and skip" classname="suite.Multi">
  <error message="broke">x</error><skipped message="skipped"/></testcase>
<testcase name="two skips" classname="suite.Multi">
  <skipped message="first"/><skipped message="second"/></testcase>
<testcase name="passes" classname="suite.Multi"/>
</testsuite></testsuites>
"""


def test_a_testcase_with_several_results_is_one_outcome(tmp_path: Path) -> None:
    path = tmp_path / "junit.multiresult.xml"
    path.write_text(MULTIRESULT)
    summary = parse_junit([path])
    assert count_line(summary) == "1 failed, 1 passed, 1 skipped, 1 error"
    assert summary.tests == 4
    assert summary.skip_reasons == {"first": 1}
    assert sorted(f.kind for f in summary.failures) == ["error", "error", "failure"]


def test_a_header_that_declares_failures_without_testcases_is_not_neutral(
    tmp_path: Path,
) -> None:
    path = tmp_path / "junit.header-only.xml"
    path.write_text('<testsuite name="gpu-kernels" tests="6" failures="1" skipped="1"/>')
    summary = parse_junit([path])
    assert count_line(summary) == "1 failed, 4 passed, 1 skipped"
    conclusion, title = judged(summary)
    assert (conclusion, title) == (Conclusion.FAILURE, "1 failed, 4 passed, 1 skipped")
    assert summary.failures[0].message == (
        "testsuite gpu-kernels declares 1 failures and 0 errors but lists no testcases"
    )


def test_a_parent_suite_counts_its_children_not_its_header(tmp_path: Path) -> None:
    path = tmp_path / "nested.xml"
    path.write_text(
        '<testsuites tests="9" failures="9"><testsuite name="outer" tests="9" failures="9">'
        '<testsuite name="inner" tests="1"><testcase classname="m" name="t"/></testsuite>'
        "</testsuite></testsuites>"
    )
    assert count_line(parse_junit([path])) == "1 passed"


def judged(summary: Summary) -> tuple[Conclusion, str]:
    verdict = judge(RunReport(summary), batch="b", allow_no_tests=False, sha="", host="")
    return verdict.conclusion, verdict.title


def test_foreign_paths_are_made_relative_or_dropped_never_linked(tmp_path: Path) -> None:
    path = tmp_path / "junit.paths.xml"
    cases = [
        ("tests.test_x", "file:///home/ci/src/tests/test_x.py"),
        ("other.module", "/opt/elsewhere/check.py"),
        ("win", "C:\\\\build\\\\win.py"),
        ("up", "../../etc/up.py"),  # path-check: hostile input
    ]
    body = "".join(
        f'<testcase classname="{c}" name="t" file="{f}"><failure message="m">x</failure></testcase>'
        for c, f in cases
    )
    path.write_text(f"<testsuite>{body}</testsuite>")
    summary = parse_junit([path])
    assert [f.file for f in summary.failures] == ["tests/test_x.py", None, "win.py", None]
    verdict = judge(RunReport(summary), batch="b", allow_no_tests=False, sha="", host="")
    assert [a["path"] for a in verdict.output.annotations] == ["tests/test_x.py", "win.py"]


def test_a_hosts_absolute_path_is_not_annotated(tmp_path: Path) -> None:
    """The host is not trusted to give repository paths: the bot's judge checks them too."""
    failure = Failure("t", "failure", "m", file="file:///etc/passwd", line=1)
    verdict = judge(
        RunReport(Summary(tests=1, failed=1, failures=[failure])),
        batch="b", allow_no_tests=False, sha="", host="",
    )  # fmt: skip
    assert verdict.output.annotations == []
    assert "/etc/passwd" not in verdict.output.text.split("```")[0]


@pytest.mark.parametrize(
    ("file", "classname", "expected"),
    [
        ("tests/test_x.py", "", "tests/test_x.py"),
        ("./tests//test_x.py", "", "tests/test_x.py"),
        ("file:///home/u/p/tests/test_x.py", "tests.test_x.TestC", "tests/test_x.py"),
        ("/abs/elsewhere.py", "tests.test_x", None),
        ("https://example.com/tests/test_x.py", "tests.test_x", "tests/test_x.py"),
        ("tests/../../x.py", "", None),
        ("", "", None),
    ],
)
def test_repo_path(file: str, classname: str, expected: str | None) -> None:
    assert repo_path(file, classname) == expected


# --- 7. a closed pipe -----------------------------------------------------------------------


def test_summarize_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    path = tmp_path / "big.xml"
    failure = '<failure message="m">' + "x = torch.ones(3)\n" * 200 + "</failure>"
    cases = "".join(f'<testcase classname="m" name="t{i}">{failure}</testcase>' for i in range(60))
    path.write_text(f"<testsuite>{cases}</testsuite>")
    read, write = os.pipe()
    fcntl.fcntl(write, F_SETPIPE_SZ, 4096)  # a small pipe: the reader leaves before the end
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "summarize", str(path)],
        cwd=ROOT, stdout=write, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(write)
    with os.fdopen(read, "rb") as reader:
        first = reader.readline()  # and closed, as `| head -1` does
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 128 + signal.SIGPIPE
    assert first.startswith(b"# 60 failed")
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr


def test_the_history_sees_a_test_whose_subtests_failed_as_failed(tmp_path: Path) -> None:
    """pytest counts failed subtests as failures; the test history records their test so."""
    root = project(tmp_path, {"test_sub.py": SUBTESTS}, "")
    _, _, report = pytest_line(root, "tests")
    outcomes = {t.test_id.rsplit("::", 1)[1]: t.outcome for t in read_outcomes(report)}
    assert outcomes == {
        "test_passing": Outcome.PASSED,
        "test_failing": Outcome.FAILED,
        "test_plain": Outcome.PASSED,
        "test_fixture": Outcome.FAILED,
        "test_fixture_skips": Outcome.PASSED,
    }
