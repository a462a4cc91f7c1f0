"""pytest plugin: one JSON line per test report phase, so XPASS, reruns and subtests survive
JUnit XML, and a run killed at its deadline still says what completed and what was running."""

# Loaded into the tested project's pytest as `-p gpuci_report`: imports nothing from gpuci.

from __future__ import annotations

import json
from typing import IO, Any

import pytest

_WRITER = "gpuci_report_writer"
TEXT_KEPT = 8000  # characters of a failure's text: its head and its tail, where the location is


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("gpuci").addoption(
        "--gpuci-report",
        metavar="PATH",
        default=None,
        help="write one JSON line per test report phase (outcome, wasxfail, reruns) to PATH",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("gpuci_report")
    if path and not hasattr(config, "workerinput"):  # xdist workers report via the controller
        config.pluginmanager.register(ReportWriter(open(path, "w", encoding="utf-8")), _WRITER)  # noqa: SIM115


def pytest_unconfigure(config: pytest.Config) -> None:
    writer = config.pluginmanager.get_plugin(_WRITER)
    if writer is not None:
        writer.stream.close()
        config.pluginmanager.unregister(writer, _WRITER)


class ReportWriter:
    """Writes what the controller sees: each test's start, every call and teardown, setups
    that did not pass, and collection errors and skips.

    Each attempt at a test ends with one teardown report, so they count the tests; a start
    without its teardown is a test that was running when pytest stopped.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, line: dict[str, Any]) -> None:
        self.stream.write(json.dumps(line, default=str) + "\n")
        self.stream.flush()  # a run killed at its deadline keeps every line written

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.write({"nodeid": nodeid, "when": "start"})

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "setup" or report.outcome != "passed":
            self.write(report_line(report))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed or report.skipped:
            line = {"nodeid": report.nodeid, "when": "collect", "outcome": report.outcome}
            self.write(line | _details(report))


def report_line(report: pytest.TestReport) -> dict[str, Any]:
    """The fields gpuci reads: the outcome, the xfail reason JUnit XML drops, the subtest, and
    for a failure or skip what JUnit would have said of it."""
    wasxfail = getattr(report, "wasxfail", None)
    line: dict[str, Any] = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "wasxfail": None if wasxfail is None else str(wasxfail),
        "duration": round(float(getattr(report, "duration", 0.0)), 6),
        "location": list(report.location),
    }
    if report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
        line["xpass_strict"] = True
    subtest = _subtest(report)
    if subtest is not None:
        line["subtest"] = subtest
    return line | _details(report)


def _subtest(report: pytest.TestReport) -> str | None:
    """A subtest's description ("[msg] (i=3)"), None for a test's own report. pytest 9's
    SubtestReport and pytest-subtests' SubTestReport both carry a context."""
    if type(report).__name__ not in ("SubtestReport", "SubTestReport"):
        return None
    describe = getattr(report, "_sub_test_description", None)
    return str(describe()) if callable(describe) else "(<subtest>)"


def _details(report: pytest.TestReport | pytest.CollectReport) -> dict[str, Any]:
    """A failure's message and text, or a skip's reason, as JUnit XML would hold them."""
    if report.passed or report.longrepr is None:
        return {}
    if report.skipped:
        if getattr(report, "wasxfail", None) is not None:
            return {}  # an xfail's reason is wasxfail; its longrepr is the expected exception
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
        # what `pytest -rs` prints: longrepr is (path, line, "Skipped: why")
        return {
            "reason": str(reason).removeprefix("Skipped: ").strip()[:1000] or "(no reason given)"
        }
    text = str(report.longrepr)
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None) or (text.strip().splitlines() or [""])[-1]
    if len(text) > TEXT_KEPT:
        half = TEXT_KEPT // 2
        omitted = f"\n[... {len(text) - TEXT_KEPT} characters omitted ...]\n"
        text = text[:half] + omitted + text[-half:]
    return {"message": str(message), "text": text}
