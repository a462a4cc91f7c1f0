"""JUnit parsing: counts equal pytest's own summary line, for real runs and hostile files."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.results import Summary, count_line
from workers.junit import JUnitError, node_id, parse_junit

ROOT = Path(__file__).resolve().parent.parent
SUITES = Path(__file__).resolve().parent / "suites"
PLUGIN = ROOT / "workers" / "pytest_plugin"
OUTCOMES = {"test_outcomes.py": "case_outcomes.py", "test_module_skip.py": "case_module_skip.py"}
COLLECT_ERROR = {
    "test_broken.py": "case_collect_error.py",
    "test_module_skip.py": "case_module_skip.py",
}


@dataclass
class Run:
    """One real pytest run of a suite: its terminal output and the files gpuci reads."""

    stdout: str
    junit: Path
    report: Path

    def summary_line(self) -> str:
        """pytest's last line, e.g. '4 failed, 8 passed, 3 errors, 8 rerun', without the time."""
        last = self.stdout.strip().splitlines()[-1]
        match = re.search(r"=+ (.+) in [\d.]+s", last)
        assert match, last
        return match.group(1)

    def short_summary(self, word: str) -> list[str]:
        """The `-ra` lines for one outcome word, e.g. 'SKIPPED [2] tests/x.py:4: reason'."""
        return [line for line in self.stdout.splitlines() if line.startswith(word + " ")]


def run_suite(tmp: Path, cases: dict[str, str], *args: str) -> Run:
    (tmp / "tests").mkdir(parents=True)
    (tmp / "pytest.ini").write_text("[pytest]\n")  # the rootdir: this project's config stays out
    for name, case in cases.items():
        shutil.copy(SUITES / case, tmp / "tests" / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = str(PLUGIN)
    junit, report = tmp / "junit.xml", tmp / "report.jsonl"
    command = [sys.executable, "-m", "pytest", "-p", "gpuci_report", f"--gpuci-report={report}"]
    command += [f"--junitxml={junit}", "-o", "junit_family=xunit1", "-p", "no:cacheprovider"]
    command += ["-ra", "--color=no", *args, "tests"]
    done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1, 2), done.stdout + done.stderr
    return Run(done.stdout, junit, report)


@pytest.fixture(scope="module")
def reruns_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_suite(tmp_path_factory.mktemp("reruns"), OUTCOMES, "--reruns", "1")


@pytest.fixture(scope="module")
def xdist_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_suite(tmp_path_factory.mktemp("xdist"), OUTCOMES, "-n", "2", "--reruns", "1")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_suite(tmp_path_factory.mktemp("plain"), OUTCOMES)


@pytest.fixture(scope="module")
def collect_error_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_suite(tmp_path_factory.mktemp("collect"), COLLECT_ERROR)


ALL_RUNS = ["plain_run", "reruns_run", "xdist_run", "collect_error_run"]


def parsed(run: Run) -> Summary:
    return parse_junit([run.junit], run.report)


@pytest.mark.parametrize("run_name", ALL_RUNS)
def test_counts_equal_pytests_summary_line(run_name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(run_name)
    assert count_line(parsed(run)) == run.summary_line()


def test_every_outcome_is_exercised(reruns_run: Run) -> None:
    words = {part.split(" ", 1)[1] for part in reruns_run.summary_line().split(", ")}
    assert words == {"failed", "passed", "skipped", "xfailed", "xpassed", "errors", "rerun"}


@pytest.mark.parametrize("run_name", ["plain_run", "reruns_run", "xdist_run"])
def test_xpass_is_named(run_name: str, request: pytest.FixtureRequest) -> None:
    summary = parsed(request.getfixturevalue(run_name))
    assert summary.xpassed_tests == ["tests/test_outcomes.py::test_xpass"]


@pytest.mark.parametrize("run_name", ["plain_run", "reruns_run", "xdist_run"])
def test_each_test_counted_once(run_name: str, request: pytest.FixtureRequest) -> None:
    # 19 items in case_outcomes.py (3 of them parameters) + 1 skipped module; reruns and
    # teardown errors add reports and JUnit testcases, never tests
    assert parsed(request.getfixturevalue(run_name)).tests == 20


@pytest.mark.parametrize("run_name", ["plain_run", "xdist_run", "collect_error_run"])
def test_skip_reasons_match_pytest_ra(run_name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(run_name)
    expected: Counter[str] = Counter()
    for line in run.short_summary("SKIPPED"):
        match = re.fullmatch(r"SKIPPED \[(\d+)\] \S+:\d+: (.*)", line)
        assert match, line
        expected[match.group(2)] += int(match.group(1))
    assert parsed(run).skip_reasons == dict(expected)


@pytest.mark.parametrize("run_name", ALL_RUNS)
def test_failures_are_the_ones_pytest_lists(run_name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(run_name)
    expected = Counter(
        (word.lower(), line.split(" ")[1])
        for word in ("FAILED", "ERROR")
        for line in run.short_summary(word)
    )
    got = Counter((f.kind.replace("failure", "failed"), f.test_id) for f in parsed(run).failures)
    assert got == expected


def line_of(text: str) -> int:
    lines = (SUITES / "case_outcomes.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize(
    ("test", "kind", "message", "line_text"),
    [
        ("test_fail", "failure", "AssertionError: matmul mismatch", "assert total == 3"),
        ("TestOptimizer::test_diverges", "failure", "ValueError: loss is nan", "loss is nan"),
        ("test_xpass_strict", "failure", "[XPASS(strict)] fixed upstream?", "strict=True"),
        ("test_setup_error", "error", "GPU context could not be created", "raise RuntimeError"),
        ("test_teardown_error", "error", 'failed on teardown with "RuntimeError', "leaked CUDA"),
    ],
)
def test_failure_points_at_the_failing_line(
    xdist_run: Run, test: str, kind: str, message: str, line_text: str
) -> None:
    failures = {f.test_id: f for f in parsed(xdist_run).failures}
    failure = failures[f"tests/test_outcomes.py::{test}"]
    assert (failure.kind, failure.file) == (kind, "tests/test_outcomes.py")
    assert message in failure.message
    assert failure.line == line_of(line_text)


def test_without_report_xpass_reads_as_a_pass(plain_run: Run) -> None:
    with_report, junit_only = parsed(plain_run), parse_junit([plain_run.junit])
    assert junit_only.xpassed == 0
    assert junit_only.passed == with_report.passed + with_report.xpassed
    assert (junit_only.failed, junit_only.errors, junit_only.skipped, junit_only.xfailed) == (
        with_report.failed,
        with_report.errors,
        with_report.skipped,
        with_report.xfailed,
    )
    assert junit_only.tests == with_report.tests


def test_files_aggregate(plain_run: Run, collect_error_run: Run) -> None:
    both = parse_junit([plain_run.junit, collect_error_run.junit])
    one, other = parse_junit([plain_run.junit]), parse_junit([collect_error_run.junit])
    assert (both.passed, both.errors, both.skipped, both.tests) == (
        one.passed + other.passed,
        one.errors + other.errors,
        one.skipped + other.skipped,
        one.tests + other.tests,
    )
    assert both.duration_s == pytest.approx(one.duration_s + other.duration_s, abs=0.002)


def test_slowest_are_distinct_and_sorted(reruns_run: Run) -> None:
    slowest = parsed(reruns_run).slowest
    assert 0 < len(slowest) <= 10
    assert len({tid for tid, _ in slowest}) == len(slowest)
    assert [t for _, t in slowest] == sorted((t for _, t in slowest), reverse=True)


def test_report_plugin_imports_nothing_from_gpuci() -> None:
    tree = ast.parse((PLUGIN / "gpuci_report.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported <= {"__future__", "json", "typing", "pytest"}


@pytest.mark.parametrize(
    ("classname", "name", "file", "expected"),
    [
        ("tests.test_x.TestC", "test_y", "tests/test_x.py", "tests/test_x.py::TestC::test_y"),
        ("tests.test_x", "test_y[a.b]", "tests/test_x.py", "tests/test_x.py::test_y[a.b]"),
        ("tests.test_x.TestA.TestB", "test_y", None, "tests/test_x.py::TestA::TestB::test_y"),
        ("", "tests.test_broken", "tests/test_broken.py", "tests/test_broken.py"),
        ("", "tests.test_broken", None, "tests/test_broken.py"),
    ],
)
def test_node_ids_from_junit(classname: str, name: str, file: str | None, expected: str) -> None:
    assert node_id(classname, name, file) == expected


XML = b'<?xml version="1.0" encoding="utf-8"?>'
LAUGHS = (
    XML
    + b"""<!DOCTYPE t [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>
<testsuites><testsuite><testcase name="&d;"/></testsuite></testsuites>"""
)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            XML + b'<!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]><testsuites>&x;'
            b"</testsuites>",
            ":1: refused: a DTD",
            id="external-entity",
        ),
        pytest.param(LAUGHS, ":1: refused: a DTD", id="billion-laughs"),
        pytest.param(
            XML + b'<!DOCTYPE testsuites SYSTEM "http://example.com/j.dtd"><testsuites/>',
            ":1: refused: a DTD",
            id="dtd",
        ),
        pytest.param(
            b"<testsuites>" + b"<testsuite>" * 5000, "nested deeper than 32", id="deep-nesting"
        ),
        pytest.param(
            XML + b'<testsuites>\n<testsuite>\n<testcase name="\xff\xfe"/>',
            ":3: not well-formed XML",
            id="invalid-utf8",
        ),
        pytest.param(
            XML + b'<testsuites><testsuite>\n<testcase name="a">\n<failure message="boo',
            "truncated or corrupt",
            id="truncated",
        ),
        pytest.param(b"<html><body>502 Bad Gateway</body></html>", "not a JUnit", id="html"),
        pytest.param(b"", "file is empty", id="empty"),
        pytest.param(b"\n  \n", "file is empty", id="blank"),
        pytest.param(b"<testsuites>&nbsp;</testsuites>", ":1: not well-formed", id="entity-ref"),
    ],
)
def test_hostile_junit_is_refused_with_file_and_line(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "junit.xml"
    path.write_bytes(content)
    with pytest.raises(JUnitError) as raised:
        parse_junit([path])
    assert str(raised.value).startswith(str(path))
    assert expected in str(raised.value)


def test_missing_file_is_a_junit_error(tmp_path: Path) -> None:
    with pytest.raises(JUnitError, match="cannot read"):
        parse_junit([tmp_path / "absent.xml"])


def test_corrupt_report_line_is_named(plain_run: Run, tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    report.write_text(plain_run.report.read_text() + "[1, 2]\n")
    lines = report.read_text().count("\n")
    with pytest.raises(JUnitError, match=rf"report.jsonl:{lines}: not a gpuci report line"):
        parse_junit([plain_run.junit], report)


def test_report_cut_short_by_a_kill_keeps_complete_lines(plain_run: Run, tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    report.write_text(plain_run.report.read_text() + '{"nodeid": "tests/test_outcomes.py::te')
    assert parse_junit([plain_run.junit], report) == parsed(plain_run)


def write_big_junit(path: Path, cases: int, text_chars: int = 200) -> None:
    """A pytest-like JUnit file: 1 in 10 failures, 1 in 10 skips, the rest passes."""
    filler = "    x = torch.ones(3)\n" * (text_chars // 22)
    with path.open("w", encoding="utf-8") as out:
        out.write('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite time="99.5">')
        for i in range(cases):
            attrs = f'classname="tests.test_m{i % 50}.TestK" name="test_{i}" '
            attrs += f'file="tests/test_m{i % 50}.py" line="{i % 400}" time="0.{i % 997:03d}"'
            if i % 10 == 0:
                body = f'<failure message="AssertionError: {i}">{filler}'
                body += f"tests/test_m{i % 50}.py:{i % 400 + 3}: AssertionError</failure>"
            elif i % 10 == 1:
                body = f'<skipped type="pytest.skip" message="needs {i % 3 + 2} GPUs">x</skipped>'
            else:
                body = "<system-out>step 1\nstep 2\n</system-out>"
            out.write(f"<testcase {attrs}>{body}</testcase>\n")
        out.write("</testsuite></testsuites>")


def test_100k_testcases_parse_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.xml"
    write_big_junit(path, 100_000, text_chars=40)
    tracemalloc.start()
    try:
        summary = parse_junit([path], max_failures_kept=200)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (summary.tests, summary.failed, summary.skipped, summary.passed) == (
        100_000,
        10_000,
        10_000,
        80_000,
    )
    assert (len(summary.failures), summary.failures_dropped) == (200, 9_800)
    assert summary.skip_reasons == {
        "needs 2 GPUs": 3333,
        "needs 3 GPUs": 3334,
        "needs 4 GPUs": 3333,
    }
    assert peak < 4 * 2**20, (
        f"peak {peak / 2**20:.1f} MiB for a {path.stat().st_size >> 20} MiB file"
    )


def test_long_traceback_is_cut_but_keeps_its_location(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    write_big_junit(path, 1, text_chars=2_000_000)
    (failure,) = parse_junit([path], max_text_chars=4000).failures
    assert len(failure.text) < 4100
    assert "characters omitted" in failure.text
    assert (failure.file, failure.line) == ("tests/test_m0.py", 3)
