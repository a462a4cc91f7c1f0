"""pytest plugin: one JSON line per test report phase, so XPASS and reruns survive JUnit XML."""

# Loaded into the tested project's pytest as `-p gpuci_report`: imports nothing from gpuci.

from __future__ import annotations

import json
from typing import IO, Any

import pytest

_WRITER = "gpuci_report_writer"


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
    """Writes what the controller sees: every call and teardown, and setups that did not pass.

    Each attempt at a test ends with one teardown report, so they count the tests.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "setup" or report.outcome != "passed":
            self.stream.write(json.dumps(report_line(report), default=str) + "\n")
            self.stream.flush()


def report_line(report: pytest.TestReport) -> dict[str, Any]:
    """The fields gpuci reads: the outcome, and the xfail reason JUnit XML drops."""
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
    if report.skipped and wasxfail is None:
        line["reason"] = skip_reason(report.longrepr)
    return line


def skip_reason(longrepr: Any) -> str:
    """What `pytest -rs` prints for a skip: its longrepr is (path, line, "Skipped: why")."""
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
    return text.removeprefix("Skipped: ").strip()[:1000] or "(no reason given)"
