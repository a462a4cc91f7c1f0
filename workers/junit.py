"""JUnit XML from pytest -> true counts, streamed and without entity expansion."""

from __future__ import annotations

import ast
import heapq
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from xml.parsers.expat import ExpatError, XMLParserType

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

MAX_DEPTH = 32  # pytest writes 4 levels; anything much deeper is hostile
MAX_SKIP_REASONS = 100  # distinct reasons kept; the rest are grouped under OTHER_REASONS
OTHER_REASONS = "(other reasons)"
SLOWEST_KEPT = 10
_CHUNK = 1 << 16
_ROOTS = ("testsuites", "testsuite")
_RESULTS = ("failure", "error", "skipped")
_RERUNS = ("rerunFailure", "rerunError", "flakyFailure", "flakyError")
_COLLECTION = ("collection failure", "collection skipped", "internal error")
_TB_LOCATION = re.compile(
    r'^\s*File "(?P<q>[^"\n]+\.py)", line (?P<ql>\d+)|^(?P<p>[^\s:][^:\n]*\.py):(?P<pl>\d+): ',
    re.MULTILINE,
)


class JUnitError(Exception):
    """A JUnit XML or report file that cannot be read as one; the message names file and line."""


@dataclass(frozen=True)
class Failure:
    """A failed or errored test, with where to annotate it."""

    test_id: str
    kind: str  # "failure" | "error"
    message: str
    text: str = ""
    file: str | None = None
    line: int | None = None


@dataclass
class Summary:
    """A batch's results, counted as pytest's terminal summary line counts them."""

    tests: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0
    xpassed: int = 0
    xpassed_tests: list[str] = field(default_factory=list)
    skip_reasons: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    slowest: list[tuple[str, float]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    reruns: int = 0
    failures_dropped: int = 0  # failures beyond max_failures_kept, counted but not kept


def parse_junit(
    paths: Sequence[Path],
    report: Path | None = None,
    *,
    max_failures_kept: int = 200,
    max_text_chars: int = 4000,
) -> Summary:
    """Counts as pytest's own summary line gives them, from JUnit files and the gpuci report.

    With the report (the gpuci_report plugin's JSON lines), test outcomes come from it, as
    pytest's terminal counts them (XPASS and reruns included); the JUnit files still give
    collection errors and skips, failure texts, skip reasons and durations.
    """
    tally = _Tally(max_failures_kept, max_text_chars, counts_cases=report is None)
    for path in paths:
        _parse_file(Path(path), tally)
    if report is not None:
        _apply_report(Path(report), tally)
    return tally.summary()


def count_line(summary: Summary) -> str:
    """pytest's summary line: "3 failed, 5 passed, 2 skipped, 1 xfailed, 2 errors, 1 rerun"."""
    parts = [
        ("failed", summary.failed),
        ("passed", summary.passed),
        ("skipped", summary.skipped),
        ("xfailed", summary.xfailed),
        ("xpassed", summary.xpassed),
        ("error" if summary.errors == 1 else "errors", summary.errors),
        ("rerun", summary.reruns),
    ]
    return ", ".join(f"{n} {word}" for word, n in parts if n) or "no tests ran"


def node_id(classname: str, name: str, file: str | None) -> str:
    """The pytest node id of a JUnit testcase: `tests/test_x.py::TestC::test_y`."""
    parts = classname.split(".") if classname else []
    if file and file.endswith(".py"):
        module = file.removesuffix(".py").replace("/", ".").split(".")
        if parts[: len(module)] == module:
            return "::".join([file, *parts[len(module) :], name])
        if not parts and name.split(".") == module:
            return file  # a collection error or module-level skip
    classes = 0
    while classes < len(parts) - 1 and parts[-1 - classes][:1].isupper():
        classes += 1
    module_parts = parts[: len(parts) - classes] or name.split(".")
    path = "/".join(module_parts) + ".py"
    if not parts:
        return path
    return "::".join([path, *parts[len(parts) - classes :], name])


def skip_reason(message: str, text: str) -> str:
    """The reason as `pytest -ra` shows it, without the "Skipped: " prefix or location."""
    if message == "collection skipped":
        message = _module_skip_reason(text)
    return message.removeprefix("Skipped: ").strip() or "(no reason given)"


def _module_skip_reason(text: str) -> str:
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text.rsplit(": ", 1)[-1]
    return str(value[-1]) if isinstance(value, tuple) and value else str(value)


def failure_location(
    text: str, file: str | None, line: int | None
) -> tuple[str | None, int | None]:
    """Where to annotate: the last traceback line in the test's own file, else its definition."""
    found: tuple[str, int] | None = None
    for match in _TB_LOCATION.finditer(text):
        path = match.group("q") or match.group("p")
        number = int(match.group("ql") or match.group("pl"))
        if file and (path == file or path.endswith("/" + file)):
            found = (file, number)
    if found:
        return found
    return file, None if line is None else line + 1  # JUnit's line is 0-based


class _Capped:
    """Text kept within a budget: its head and its tail, where pytest puts the location."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = ""
        self.tail = ""
        self.size = 0

    def add(self, chunk: str) -> None:
        self.size += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail = (self.tail + chunk)[-self.half :]

    def text(self) -> str:
        omitted = self.size - len(self.head) - len(self.tail)
        if omitted <= 0:
            return self.head + self.tail
        return f"{self.head}\n[... {omitted} characters omitted ...]\n{self.tail}"


@dataclass
class _Result:
    tag: str
    attrs: dict[str, str]
    text: _Capped


@dataclass
class _Case:
    attrs: dict[str, str]
    results: list[_Result] = field(default_factory=list)
    reruns: int = 0

    @cached_property
    def id(self) -> str:
        a = self.attrs
        return node_id(a.get("classname", ""), a.get("name", ""), a.get("file"))

    def line(self) -> int | None:
        value = self.attrs.get("line", "")
        return int(value) if value.isdigit() else None

    def is_collection(self) -> bool:
        return any(r.attrs.get("message") in _COLLECTION for r in self.results)


# the kind of a JUnit result element -> the Summary counter it bumps
_JUNIT_COUNTERS = {
    "failure": "failed",
    "error": "errors",
    "teardown error": "errors",
    "skipped": "skipped",
    "xfailed": "xfailed",
}


class _Tally:
    """Running counts and kept details, bounded however large the input."""

    def __init__(self, max_failures: int, max_text: int, *, counts_cases: bool) -> None:
        self.s = Summary()
        self.max_failures = max_failures
        self.max_text = max_text
        self.counts_cases = counts_cases  # False: the report counts test phases, JUnit collection
        self.failed_calls: set[int] = set()  # a later teardown error of these is no new test
        self.slow: list[tuple[float, str]] = []
        self.suite_time = 0.0
        self.case_time = 0.0

    def summary(self) -> Summary:
        self.s.duration_s = round(self.suite_time or self.case_time, 3)
        self.s.slowest = [(tid, t) for t, tid in sorted(self.slow, reverse=True)]
        return self.s

    def add_case(self, case: _Case) -> None:
        kinds = [_kind(r) for r in case.results]
        if self.counts_cases or case.is_collection():
            self._count(case, kinds)
        seconds = _float(case.attrs.get("time"))
        self.case_time += seconds
        self._time(case, seconds)
        for result, kind in zip(case.results, kinds, strict=True):
            if kind == "skipped":
                self._skip_reason(skip_reason(result.attrs.get("message", ""), result.text.text()))
            elif kind in ("failure", "error", "teardown error"):
                self._failure(case, result, kind)

    def _count(self, case: _Case, kinds: list[str]) -> None:
        """pytest 9 writes a failed call and its teardown error as two testcases of one test."""
        s = self.s
        s.reruns += case.reruns
        if "failure" in kinds:
            self.failed_calls.add(hash(case.id))
        teardown_only = kinds == ["teardown error"]
        if not (teardown_only and hash(case.id) in self.failed_calls):
            s.tests += 1
            s.passed += not kinds or teardown_only  # the call passed, then teardown failed
        for kind in kinds:
            counter = _JUNIT_COUNTERS[kind]
            setattr(s, counter, getattr(s, counter) + 1)

    def _skip_reason(self, reason: str) -> None:
        reasons = self.s.skip_reasons
        if reason not in reasons and len(reasons) >= MAX_SKIP_REASONS:
            reason = OTHER_REASONS
        reasons[reason] = reasons.get(reason, 0) + 1

    def _failure(self, case: _Case, result: _Result, kind: str) -> None:
        if len(self.s.failures) >= self.max_failures:
            self.s.failures_dropped += 1
            return
        text = result.text.text()
        file, line = failure_location(text, case.attrs.get("file"), case.line())
        message = result.attrs.get("message", "")[: self.max_text]
        kind = "failure" if kind == "failure" else "error"
        self.s.failures.append(Failure(case.id, kind, message, text, file, line))

    def _time(self, case: _Case, seconds: float) -> None:
        if len(self.slow) >= SLOWEST_KEPT and seconds <= self.slow[0][0]:
            return
        for i, (t, other) in enumerate(self.slow):
            if other == case.id:  # a test with two testcases: its longest
                self.slow[i] = (max(t, seconds), other)
                heapq.heapify(self.slow)
                return
        if len(self.slow) < SLOWEST_KEPT:
            heapq.heappush(self.slow, (seconds, case.id))
        else:
            heapq.heapreplace(self.slow, (seconds, case.id))


def _kind(result: _Result) -> str:
    message = result.attrs.get("message", "")
    if result.tag == "skipped":
        if result.attrs.get("type") == "pytest.xfail":
            return "xfailed"
        return "failure" if message == "xfail-marked test passes unexpectedly" else "skipped"
    if result.tag == "error" and message.startswith("failed on teardown"):
        return "teardown error"
    return result.tag


def _float(value: str | None) -> float:
    try:
        seconds = float(value or 0)
    except ValueError:
        return 0.0
    return seconds if seconds >= 0 and seconds != float("inf") else 0.0


class _Target:
    """Streaming target of the XML parser: one testcase in memory at a time."""

    def __init__(self, path: Path, tally: _Tally) -> None:
        self.path = path
        self.tally = tally
        self.stack: list[str] = []
        self.case: _Case | None = None
        self.result: _Result | None = None

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self._check(tag)
        self.stack.append(tag)
        if tag == "testsuite" and "testsuite" not in self.stack[:-1]:
            self.tally.suite_time += _float(attrs.get("time"))
        elif tag == "testcase":
            self.case = _Case(dict(attrs))
        elif self.case is not None and len(self.stack) >= 2 and self.stack[-2] == "testcase":
            self._start_result(tag, attrs)

    def _check(self, tag: str) -> None:
        if not self.stack and tag not in _ROOTS:
            raise JUnitError(
                f"{self.path}: root element <{tag}> is not <testsuites> or <testsuite>:"
                " not a JUnit XML file"
            )
        if len(self.stack) >= MAX_DEPTH:
            raise JUnitError(f"{self.path}: elements nested deeper than {MAX_DEPTH} levels")

    def _start_result(self, tag: str, attrs: dict[str, str]) -> None:
        assert self.case is not None
        if tag in _RESULTS:
            self.result = _Result(tag, dict(attrs), _Capped(self.tally.max_text))
            self.case.results.append(self.result)
        elif tag in _RERUNS:
            self.case.reruns += 1

    def data(self, chunk: str) -> None:
        if self.result is not None:
            self.result.text.add(chunk)

    def end(self, tag: str) -> None:
        self.stack.pop()
        if tag == "testcase" and self.case is not None:
            self.tally.add_case(self.case)
            self.case = None
        elif self.result is not None and tag == self.result.tag:
            self.result = None


def _parse_file(path: Path, tally: _Tally) -> None:
    expat = _defused_expat(_Target(path, tally))
    empty = True
    try:
        for chunk in _chunks(path):
            empty = empty and not chunk.strip()
            expat.Parse(chunk, False)
        if empty:
            raise JUnitError(f"{path}: file is empty (was pytest killed before writing it?)")
        expat.Parse(b"", True)
    except ExpatError as exc:
        raise JUnitError(
            f"{path}:{exc.lineno}: not well-formed XML (truncated or corrupt): {exc}"
        ) from None
    except DefusedXmlException as exc:
        raise JUnitError(f"{path}:{expat.CurrentLineNumber}: refused: {_refusal(exc)}") from None


def _defused_expat(target: _Target) -> XMLParserType:
    """defusedxml's expat parser (no DTD, entities or external references), feeding target."""
    expat = DefusedXMLParser(forbid_dtd=True).parser
    expat.ordered_attributes = False
    expat.StartElementHandler = target.start
    expat.EndElementHandler = target.end
    expat.CharacterDataHandler = target.data
    return expat


def _refusal(exc: DefusedXmlException) -> str:
    names = {
        "DTDForbidden": "a DTD (<!DOCTYPE>) is not allowed in JUnit XML",
        "EntitiesForbidden": "entity declarations are not allowed in JUnit XML",
        "ExternalReferenceForbidden": "external references are not allowed in JUnit XML",
    }
    return names.get(type(exc).__name__, str(exc))


def _chunks(path: Path) -> Iterator[bytes]:
    try:
        with path.open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                yield chunk
    except OSError as exc:
        raise JUnitError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _apply_report(path: Path, tally: _Tally) -> None:
    """Count test phases as pytest's terminal does, and tests by the teardown of their last try."""
    rerun: set[str] = set()  # tests whose current attempt will be rerun: few at any time
    for entry in _report_lines(path):
        nodeid, when = str(entry.get("nodeid", "")), entry.get("when")
        if entry.get("outcome") == "rerun":
            rerun.add(nodeid)
        if when not in ("setup", "call"):
            tally.s.tests += nodeid not in rerun
            rerun.discard(nodeid)
        _count_report(entry, tally.s)


def _count_report(entry: dict[str, Any], s: Summary) -> None:
    outcome, when = entry.get("outcome"), entry.get("when")
    if outcome == "passed" and when != "call":
        return
    fixture = when in ("setup", "teardown")
    counter = _REPORT_COUNTERS.get((outcome, fixture, entry.get("wasxfail") is not None))
    if counter is not None:
        setattr(s, counter, getattr(s, counter) + 1)
    if counter == "xpassed":
        s.xpassed_tests.append(str(entry.get("nodeid", "")))


# (outcome, in setup or teardown, marked xfail) -> the Summary counter pytest's terminal bumps
_REPORT_COUNTERS: dict[tuple[object, bool, bool], str] = {
    **{("rerun", fixture, x): "reruns" for fixture in (True, False) for x in (True, False)},
    ("passed", False, False): "passed",
    ("passed", False, True): "xpassed",
    **{("failed", False, x): "failed" for x in (True, False)},
    **{("failed", True, x): "errors" for x in (True, False)},
    **{("skipped", fixture, False): "skipped" for fixture in (True, False)},
    **{("skipped", fixture, True): "xfailed" for fixture in (True, False)},
}


def _report_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The report's JSON objects; a last line cut short by a killed run is dropped."""
    try:
        with path.open(encoding="utf-8", errors="replace") as stream:
            for number, line in enumerate(stream, 1):
                if not line.endswith("\n"):
                    return
                yield _report_entry(path, number, line)
    except OSError as exc:
        raise JUnitError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _report_entry(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        entry = None
    if not isinstance(entry, dict):
        raise JUnitError(f"{path}:{number}: not a gpuci report line (a JSON object)")
    return entry
