"""JUnit XML from pytest -> true counts, streamed and without entity expansion."""

from __future__ import annotations

import ast
import heapq
import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from xml.parsers.expat import (
    XML_PARAM_ENTITY_PARSING_NEVER,
    ExpatError,
    ParserCreate,
    XMLParserType,
)

from contract.results import Failure, Summary

MAX_DEPTH = 32  # pytest writes 4 levels; anything much deeper is hostile
MAX_SKIP_REASONS = 100  # distinct reasons kept; the rest are grouped under OTHER_REASONS
OTHER_REASONS = "(other reasons)"
SLOWEST_KEPT = 10
MAX_TOKEN = 8 << 20  # one tag, attribute or comment; expat buffers each whole, re-scanning
_CHUNK = 1 << 20  # bytes read and fed to expat at a time
_TEXT_BUFFER = 1 << 16  # character data handed over at a time
_INF = float("inf")
_NOT_BLANK = re.compile(rb"\S")  # what bytes.strip() keeps
_ROOTS = ("testsuites", "testsuite")
# a testcase's child elements gpuci reads: True for results, False for reruns
_CHILDREN = dict.fromkeys(("failure", "error", "skipped"), True) | dict.fromkeys(
    ("rerunFailure", "rerunError", "flakyFailure", "flakyError"), False
)
_COLLECTION = ("collection failure", "collection skipped", "internal error")
_TB_LOCATION = re.compile(
    r'^\s*File "(?P<q>[^"\n]+\.py)", line (?P<ql>\d+)|^(?P<p>[^\s:][^:\n]*\.py):(?P<pl>\d+): ',
    re.MULTILINE,
)


class JUnitError(Exception):
    """A JUnit XML or report file that cannot be read as one; the message names file and line."""


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

    __slots__ = ("half", "head", "size", "tail")

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


# a result element of a testcase: its tag, its attributes and its (capped) text
_Result = tuple[str, dict[str, str], _Capped]


def _case_id(attrs: dict[str, str]) -> str:
    return node_id(attrs.get("classname", ""), attrs.get("name", ""), attrs.get("file"))


def _case_key(attrs: dict[str, str]) -> int:
    """Equal for the testcases of one test (its call and its teardown), cheaper than its id."""
    return hash((attrs.get("classname"), attrs.get("name"), attrs.get("file")))


# the kind of a JUnit result element -> the Summary counter it bumps
_JUNIT_COUNTERS = {
    "failure": "failed",
    "error": "errors",
    "teardown error": "errors",
    "skipped": "skipped",
    "xfailed": "xfailed",
}
_FAILED = ("failure", "error", "teardown error")


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

    def slow_floor(self) -> float:
        """What a testcase's seconds must exceed to be among the slowest kept."""
        return self.slow[0][0] if len(self.slow) >= SLOWEST_KEPT else -1.0

    def add_passes(self, passes: int, seconds: float) -> None:
        """Testcases that passed without reruns (their slowest went through add_case)."""
        self.case_time += seconds
        if self.counts_cases:
            self.s.tests += passes
            self.s.passed += passes

    def add_case(
        self, attrs: dict[str, str], results: list[_Result], reruns: int, seconds: float
    ) -> None:
        """A testcase with results or reruns, or one of the slowest passes."""
        if seconds > self.slow_floor():
            self._time(attrs, seconds)
        if not results and not reruns:
            return  # counted by add_passes
        self.case_time += seconds
        kinds = [_kind(tag, a) for tag, a, _ in results]
        if self.counts_cases or any(a.get("message") in _COLLECTION for _, a, _ in results):
            self._count(attrs, kinds, reruns)
        for (_, result, text), kind in zip(results, kinds, strict=True):
            if kind == "skipped":
                message = result.get("message", "")
                self._skip_reason(
                    skip_reason(message, text.text() if message == "collection skipped" else "")
                )
            elif kind in _FAILED:
                self._failure(attrs, result, text, kind)

    def _count(self, attrs: dict[str, str], kinds: list[str], reruns: int) -> None:
        """pytest 9 writes a failed call and its teardown error as two testcases of one test."""
        s = self.s
        s.reruns += reruns
        if "failure" in kinds:
            self.failed_calls.add(_case_key(attrs))
        teardown_only = kinds == ["teardown error"]
        if not (teardown_only and _case_key(attrs) in self.failed_calls):
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

    def _failure(
        self, case: dict[str, str], result: dict[str, str], capped: _Capped, kind: str
    ) -> None:
        if len(self.s.failures) >= self.max_failures:
            self.s.failures_dropped += 1
            return
        text = capped.text()
        number = case.get("line", "")
        file, line = failure_location(
            text, case.get("file"), int(number) if number.isdigit() else None
        )
        message = result.get("message", "")[: self.max_text]
        kind = "failure" if kind == "failure" else "error"
        self.s.failures.append(Failure(_case_id(case), kind, message, text, file, line))

    def _time(self, attrs: dict[str, str], seconds: float) -> None:
        """Called only when seconds may enter the top SLOWEST_KEPT."""
        case_id = _case_id(attrs)
        for i, (t, other) in enumerate(self.slow):
            if other == case_id:  # a test with two testcases: its longest
                self.slow[i] = (max(t, seconds), other)
                heapq.heapify(self.slow)
                return
        if len(self.slow) < SLOWEST_KEPT:
            heapq.heappush(self.slow, (seconds, case_id))
        else:
            heapq.heapreplace(self.slow, (seconds, case_id))


def _kind(tag: str, attrs: dict[str, str]) -> str:
    message = attrs.get("message", "")
    if tag == "skipped":
        if attrs.get("type") == "pytest.xfail":
            return "xfailed"
        return "failure" if message == "xfail-marked test passes unexpectedly" else "skipped"
    if tag == "error" and message.startswith("failed on teardown"):
        return "teardown error"
    return tag


def _float(value: str | None) -> float:
    try:
        seconds = float(value or 0)
    except ValueError:
        return 0.0
    return seconds if 0.0 <= seconds < _INF else 0.0  # NaN fails both


class _Refused(Exception):
    """A construct JUnit XML has no use for and an attacker has: DTDs, entities."""


def _refuse_dtd(*_: object) -> None:
    raise _Refused("a DTD (<!DOCTYPE>) is not allowed in JUnit XML")


def _refuse_entity(*_: object) -> None:
    raise _Refused("entity declarations are not allowed in JUnit XML")


def _refuse_external(*_: object) -> int:
    raise _Refused("external references are not allowed in JUnit XML")


def _parser(path: Path, tally: _Tally) -> tuple[XMLParserType, Callable[[], None]]:
    """An expat parser feeding tally, and what to call once it is done.

    One testcase in memory at a time; no DTD, entities or external references. The handlers
    are closures over plain locals, as they run for every element of files with hundreds of
    thousands of testcases: no stack (a depth and the depth of the open testcase suffice), no
    object for a passing testcase unless it is among the slowest, and character data only
    inside a testcase's failure, error or skipped element.
    """
    expat = ParserCreate()
    expat.buffer_text = True
    expat.buffer_size = _TEXT_BUFFER
    expat.ordered_attributes = False
    expat.StartDoctypeDeclHandler = _refuse_dtd
    expat.EntityDeclHandler = _refuse_entity
    expat.UnparsedEntityDeclHandler = _refuse_entity
    expat.ExternalEntityRefHandler = _refuse_external
    expat.SetParamEntityParsing(XML_PARAM_ENTITY_PARSING_NEVER)

    max_text = tally.max_text
    depth = 0  # elements open
    suites = 0  # <testsuite> elements open
    case_depth = -1  # the depth of the open testcase's children, -1 when none is open
    case_attrs: dict[str, str] = {}
    results: list[_Result] = []  # the open testcase's failure, error and skipped elements
    reruns = 0
    text: _Capped | None = None  # the open result element's text
    passes = 0  # testcases passed without reruns, and their seconds: added to tally when done
    pass_seconds = 0.0
    slow_floor = tally.slow_floor()

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal depth, suites, case_depth, case_attrs, results, reruns, text
        if depth == case_depth:  # a child of the open testcase
            child = _CHILDREN.get(tag)
            if child:
                text = _Capped(max_text)
                results.append((tag, attrs, text))
                expat.CharacterDataHandler = text.add
            elif child is not None:
                reruns += 1
        elif not depth and tag not in _ROOTS:
            raise JUnitError(
                f"{path}: root element <{tag}> is not <testsuites> or <testsuite>:"
                " not a JUnit XML file"
            )
        elif tag == "testcase":
            case_depth, case_attrs, reruns = depth + 1, attrs, 0
            if results:
                results = []
        elif tag == "testsuite":
            if not suites:
                tally.suite_time += _float(attrs.get("time"))
            suites += 1
        depth += 1
        if depth > MAX_DEPTH:
            raise JUnitError(f"{path}: elements nested deeper than {MAX_DEPTH} levels")

    def end(tag: str) -> None:
        nonlocal depth, suites, case_depth, text, passes, pass_seconds, slow_floor
        depth -= 1
        if depth + 1 == case_depth:  # the testcase ends
            case_depth = -1
            try:
                seconds = float(case_attrs["time"])
            except (KeyError, ValueError):
                seconds = 0.0
            if not 0.0 <= seconds < _INF:  # NaN fails too
                seconds = 0.0
            if not results and not reruns:
                passes += 1
                pass_seconds += seconds
                if seconds <= slow_floor:
                    return
            tally.add_case(case_attrs, results, reruns, seconds)
            slow_floor = tally.slow_floor()
        elif depth == case_depth and text is not None:  # a result element ends
            text = None
            expat.CharacterDataHandler = None
        elif tag == "testsuite" and suites:
            suites -= 1

    def done() -> None:
        tally.add_passes(passes, pass_seconds)

    expat.StartElementHandler = start
    expat.EndElementHandler = end
    return expat, done


def _parse_file(path: Path, tally: _Tally) -> None:
    expat, done = _parser(path, tally)
    fed = 0
    blank = True
    try:
        with path.open("rb", buffering=0) as stream:
            buffer = bytearray(_CHUNK)
            view = memoryview(buffer)
            while size := stream.readinto(buffer):
                blank = blank and not _NOT_BLANK.search(buffer, 0, size)
                fed += size
                expat.Parse(view[:size], False)
                if fed - expat.CurrentByteIndex > MAX_TOKEN:
                    raise JUnitError(
                        f"{path}:{expat.CurrentLineNumber}: a tag, comment or attribute longer"
                        f" than {MAX_TOKEN >> 20} MiB: not JUnit XML from pytest"
                    )
        if blank:
            raise JUnitError(f"{path}: file is empty (was pytest killed before writing it?)")
        expat.Parse(b"", True)
        done()
    except OSError as exc:
        raise JUnitError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ExpatError as exc:
        raise JUnitError(
            f"{path}:{exc.lineno}: not well-formed XML (truncated or corrupt): {exc}"
        ) from None
    except _Refused as exc:
        raise JUnitError(f"{path}:{expat.CurrentLineNumber}: refused: {exc}") from None


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
