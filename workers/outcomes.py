"""Each test's outcome in a run, from the gpuci_report plugin's lines (the test history's input)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from contract.outcomes import MAX_TESTS, Outcome, TestOutcome

log = logging.getLogger("gpuci.outcomes")

MAX_ID_BYTES = 3 * 1024 * 1024  # the ids a report carries, in all: the host message has 8 MiB


def read_outcomes(report: Path | None) -> list[TestOutcome]:
    """One outcome per test, in the order the tests ran; [] without a readable report, or when
    the run has more tests than a report may list (the run then has no history, nothing else
    changes)."""
    if report is None or not report.is_file():
        return []
    tally = _Tally()
    try:
        with report.open(encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if not line.endswith("\n"):
                    break  # a last line cut short by a killed run
                entry = json.loads(line)
                if isinstance(entry, dict):
                    tally.add(entry)
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("report %s unreadable for the test history: %s", report, exc)
        return []
    tests = tally.outcomes()
    if len(tests) > MAX_TESTS or sum(len(t.test_id) for t in tests) > MAX_ID_BYTES:
        log.warning("%d tests: too many to list one by one; no history for this run", len(tests))
        return []
    return tests


class _Tally:
    """Per test: the outcome of its current attempt, its reruns, its seconds, its skip reason."""

    def __init__(self) -> None:
        self.state: dict[str, str] = {}  # insertion order: the order tests ran
        self.reruns: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.reasons: dict[str, str] = {}
        self.failed_subtests: set[str] = set()

    def add(self, entry: dict[str, Any]) -> None:
        nodeid, when, outcome = (
            str(entry.get("nodeid", "")),
            entry.get("when"),
            entry.get("outcome"),
        )
        if not nodeid or when not in ("setup", "call", "teardown"):
            return  # a test's start, a collection report (collection errors come as failures)
        if entry.get("subtest") is not None:
            if outcome == "failed":  # pytest counts it failed; the test's own call may pass
                self.failed_subtests.add(nodeid)
            return
        self.state.setdefault(nodeid, "")
        duration = entry.get("duration")
        if isinstance(duration, int | float) and 0 <= duration < 1e9:
            self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + duration
        if outcome == "rerun":  # this attempt is repeated: the next one decides
            self.reruns[nodeid] = self.reruns.get(nodeid, 0) + 1
            self.state[nodeid] = ""
        elif when == "teardown":
            if outcome == "failed" and self.state[nodeid] != Outcome.FAILED:
                self.state[nodeid] = Outcome.ERROR
        elif when in ("setup", "call"):
            self.state[nodeid] = _phase_outcome(entry, when == "setup")
            if self.state[nodeid] == Outcome.SKIPPED:
                self.reasons[nodeid] = str(entry.get("reason") or "(no reason given)")[:1000]

    def outcomes(self) -> list[TestOutcome]:
        return [
            TestOutcome(
                nodeid,
                Outcome.FAILED
                if nodeid in self.failed_subtests and state == Outcome.PASSED
                else state,
                round(self.seconds.get(nodeid, 0.0), 3),
                self.reruns.get(nodeid, 0),
                self.reasons.get(nodeid, "") if state == Outcome.SKIPPED else "",
            )
            for nodeid, state in self.state.items()
            if state
        ]


def _phase_outcome(entry: dict[str, Any], setup: bool) -> str:
    """A setup or call report's outcome, as pytest's terminal names it."""
    outcome, xfail = entry.get("outcome"), entry.get("wasxfail") is not None
    if outcome == "failed":
        return Outcome.ERROR if setup else Outcome.FAILED
    if outcome == "skipped":
        return Outcome.XFAILED if xfail else Outcome.SKIPPED
    return Outcome.XPASSED if xfail else Outcome.PASSED
