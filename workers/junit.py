"""JUnit XML from pytest -> true counts, streamed and without entity expansion."""

from __future__ import annotations

import ast
import heapq
import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeGuard
from xml.parsers.expat import (
    XML_PARAM_ENTITY_PARSING_NEVER,
    ExpatError,
    ParserCreate,
    XMLParserType,
)

from contract.results import MAX_RUNNING, Failure, Summary, repo_path

MAX_DEPTH = 32  # pytest writes 4 levels; anything much deeper is hostile
MAX_SKIP_REASONS = 100  # distinct reasons kept; the rest are grouped under OTHER_REASONS
OTHER_REASONS = "(other reasons)"
SLOWEST_KEPT = 10
ATTEMPTS_KEPT = 4096  # the latest empty testcases, remembered as possible rerun attempts
MAX_TOKEN = 8 << 20  # one tag, attribute or comment; expat buffers each whole, re-scanning
_CHUNK = 1 << 19  # bytes read and fed to expat at a time (expat keeps a copy of each)
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
        _apply_report(Path(report), tally, with_junit=True)
    return tally.summary()


def parse_report(
    report: Path, *, max_failures_kept: int = 200, max_text_chars: int = 4000
) -> Summary:
    """Counts, failures and skip reasons from the gpuci report alone, for a run whose pytest
    never wrote its JUnit XML (killed at its deadline, cancelled, `os._exit`): every test that
    completed, and in `running` the tests that had started and not finished."""
    tally = _Tally(max_failures_kept, max_text_chars, counts_cases=False)
    _apply_report(Path(report), tally, with_junit=False)
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
_WORST = ("failure", "error", "teardown error", "xfailed", "skipped")  # which result counts


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

    def add_declared(self, attrs: dict[str, str]) -> None:
        """A <testsuite> with no testcases counts what its header declares: a file that says
        `tests="6" failures="1"` and lists nothing did not pass."""
        tests, failures, errors, skipped = (
            _declared(attrs, name) for name in ("tests", "failures", "errors", "skipped")
        )
        tests = max(tests, failures + errors + skipped)
        s = self.s
        s.tests += tests
        s.failed += failures
        s.errors += errors
        s.skipped += skipped
        s.passed += tests - failures - errors - skipped
        if (failures or errors) and len(s.failures) < self.max_failures:
            name = attrs.get("name") or "(unnamed)"
            message = (
                f"testsuite {name} declares {failures} failures and {errors} errors"
                " but lists no testcases"
            )
            s.failures.append(Failure(f"testsuite {name}", "failure", message[: self.max_text]))

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
        skip_counted = bool(kinds) and min(kinds, key=_WORST.index) == "skipped"
        for (_, result, text), kind in zip(results, kinds, strict=True):
            if kind == "skipped" and skip_counted:
                skip_counted = False  # one reason per skipped test
                message = result.get("message", "")
                self.add_skip_reason(
                    skip_reason(message, text.text() if message == "collection skipped" else "")
                )
            elif kind in _FAILED:
                self._failure(attrs, result, text, kind)

    def _count(self, attrs: dict[str, str], kinds: list[str], reruns: int) -> None:
        """One outcome per testcase, the worst of its results (failure > error > skipped), as
        junitparser does; but pytest 9 writes a failed call and its teardown error as two
        testcases of one test, and a passed call with its teardown error as one: pytest counts
        1 failed and 1 error, or 1 passed and 1 error."""
        s = self.s
        s.reruns += reruns
        if "failure" in kinds:
            self.failed_calls.add(_case_key(attrs))
        teardown_only = kinds == ["teardown error"]
        if teardown_only:
            s.errors += 1
            if _case_key(attrs) not in self.failed_calls:
                s.tests += 1
                s.passed += 1  # the call passed, then teardown failed
            return
        s.tests += 1
        kind = min(kinds, key=_WORST.index) if kinds else None
        counter = _JUNIT_COUNTERS[kind] if kind else "passed"
        setattr(s, counter, getattr(s, counter) + 1)

    def add_skip_reason(self, reason: str) -> None:
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
        case_id = _case_id(case)
        message = result.get("message", "")
        file = case.get("file") or (case_id if message in _COLLECTION else None)
        file, line = failure_location(text, file, int(number) if number.isdigit() else None)
        kind = "failure" if kind == "failure" else "error"
        self.s.failures.append(Failure(case_id, kind, message[: self.max_text], text, file, line))

    def add_report_failure(self, entry: dict[str, Any], kind: str) -> None:
        """A failure as the report tells it (no JUnit file): its text and where to annotate."""
        if len(self.s.failures) >= self.max_failures:
            self.s.failures_dropped += 1
            return
        nodeid = str(entry.get("nodeid", ""))
        capped = _Capped(self.max_text)
        capped.add(str(entry.get("text", "")))
        text = capped.text()
        message = str(entry.get("message", ""))[: self.max_text]
        if entry.get("subtest") is not None:
            message = f"subtest {entry['subtest']}: {message}"
        location = entry.get("location")
        file, number = (location[0], location[1]) if _is_location(location) else (None, None)
        if entry.get("when") == "collect":
            file = nodeid
        file, line = failure_location(text, repo_path(file), number)
        self.s.failures.append(Failure(nodeid, kind, message, text, file, line))

    def _time(self, attrs: dict[str, str], seconds: float) -> None:
        self.time_of(_case_id(attrs), seconds)

    def time_of(self, case_id: str, seconds: float) -> None:
        """Called only when seconds may enter the top SLOWEST_KEPT."""
        for i, (t, other) in enumerate(self.slow):
            if other == case_id:  # a test with two testcases: its longest
                self.slow[i] = (max(t, seconds), other)
                heapq.heapify(self.slow)
                return
        if len(self.slow) < SLOWEST_KEPT:
            heapq.heappush(self.slow, (seconds, case_id))
        else:
            heapq.heapreplace(self.slow, (seconds, case_id))


def _with_repo_file(attrs: dict[str, str], file: str) -> dict[str, str]:
    """The testcase with its file as a path in the repository, or without one: an absolute
    path or a `file://` URL is never linked."""
    clean = dict(attrs)
    path = repo_path(file, attrs.get("classname", ""))
    if path is None:
        del clean["file"]
    else:
        clean["file"] = path
    return clean


def _declares_tests(attrs: dict[str, str]) -> bool:
    return any(_declared(attrs, name) for name in ("tests", "failures", "errors", "skipped"))


def _declared(attrs: dict[str, str], name: str) -> int:
    value = attrs.get(name, "")
    return min(int(value), MAX_DECLARED) if value.isdigit() else 0


MAX_DECLARED = 10**9


def _is_location(value: object) -> TypeGuard[list[Any]]:
    """pytest's report location: [file, 0-based line or None, domain]."""
    return (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[0], str)
        and (value[1] is None or (isinstance(value[1], int) and not isinstance(value[1], bool)))
    )


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
    # pytest-rerunfailures writes each attempt before the last as an empty testcase of the
    # same test, later in the file (under xdist, other tests' testcases come between): the
    # keys of the latest empty testcases, to count a repeat as a rerun, not as another test.
    track_attempts = tally.counts_cases
    attempt_keys: dict[int, None] = {}  # the keys of the latest empty testcases ...
    attempt_ring: list[int | None] = [None] * ATTEMPTS_KEPT  # ... in the order they came
    attempt_slot = 0
    cases = 0  # testcases seen
    # <testsuite> elements open: what each declares, and the testcases seen when it opened
    declared: list[tuple[dict[str, str], int]] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        nonlocal depth, suites, case_depth, case_attrs, results, reruns, text, cases
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
            file = attrs.get("file")
            if file and (file[0] in "/\\" or ":" in file or ".." in file):
                case_attrs = _with_repo_file(attrs, file)
            if results:
                results = []
            cases += 1
        elif tag == "testsuite":
            if not suites:
                tally.suite_time += _float(attrs.get("time"))
            suites += 1
            declared.append((attrs, cases))
            attempt_keys.clear()  # the same test in another suite is another run of it
        depth += 1
        if depth > MAX_DEPTH:
            raise JUnitError(f"{path}: elements nested deeper than {MAX_DEPTH} levels")

    def end(tag: str) -> None:
        nonlocal depth, suites, case_depth, text, passes, pass_seconds, slow_floor
        nonlocal attempt_slot, cases
        depth -= 1
        if depth + 1 == case_depth:  # the testcase ends
            case_depth = -1
            try:
                seconds = float(case_attrs["time"])
            except (KeyError, ValueError):
                seconds = 0.0
            if not 0.0 <= seconds < _INF:  # NaN fails too
                seconds = 0.0
            empty = not results and not reruns
            if track_attempts:
                key = hash((case_attrs.get("classname"), case_attrs.get("name")))
                if attempt_keys.pop(key, 0) is None:  # an earlier, empty one was an attempt
                    tally.s.reruns += 1
                    passes -= 1
                if empty:
                    evicted = attempt_ring[attempt_slot]
                    if evicted is not None:
                        attempt_keys.pop(evicted, None)
                    attempt_ring[attempt_slot] = key
                    attempt_keys[key] = None
                    attempt_slot = (attempt_slot + 1) % ATTEMPTS_KEPT
            if empty:
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
            attrs, cases_before = declared.pop()
            if cases == cases_before and _declares_tests(attrs):
                if tally.counts_cases:
                    tally.add_declared(attrs)
                cases += 1  # its parent's counts are its children's

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


def _apply_report(path: Path, tally: _Tally, *, with_junit: bool) -> None:
    """Count test phases as pytest's terminal does, and tests by the teardown of their last try.

    With the JUnit files parsed, they have given collection errors, failure texts and skip
    reasons; without them (`parse_report`) the report's own lines give those too.
    """
    rerun: set[str] = set()  # tests whose current attempt will be rerun: few at any time
    running: dict[str, None] = {}  # started and not torn down, in the order they started
    for entry in _report_lines(path):
        nodeid, when = str(entry.get("nodeid", "")), entry.get("when")
        if when == "start":
            running[nodeid] = None
            continue
        if when == "collect":
            if not with_junit:
                _collected(entry, tally)
            continue
        if entry.get("outcome") == "rerun":
            rerun.add(nodeid)
        if when not in ("setup", "call"):
            if nodeid not in rerun:
                tally.s.tests += 1
                running.pop(nodeid, None)
            rerun.discard(nodeid)
        counter = _count_report(entry, tally.s)
        if not with_junit:
            _detail(entry, counter, tally)
    if not with_junit:
        tally.s.running = list(running)[:MAX_RUNNING]


def _count_report(entry: dict[str, Any], s: Summary) -> str | None:
    """Bump the counter pytest's terminal bumps for this report, and say which it was."""
    outcome, when = entry.get("outcome"), entry.get("when")
    if entry.get("subtest") is not None:
        return _count_subtest(entry, s)
    if outcome == "passed" and when != "call":
        return None
    fixture = when in ("setup", "teardown")
    counter = _REPORT_COUNTERS.get((outcome, fixture, entry.get("wasxfail") is not None))
    if counter is not None:
        setattr(s, counter, getattr(s, counter) + 1)
    if counter == "xpassed":
        s.xpassed_tests.append(str(entry.get("nodeid", "")))
    return counter


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


def _count_subtest(entry: dict[str, Any], s: Summary) -> str | None:
    """pytest counts a failed subtest as failed, a skipped one as skipped (xfailed) and a
    passed one as "subtests passed", beside the tests."""
    outcome = entry.get("outcome")
    if outcome == "passed":
        s.subtests_passed += 1
        return "subtests_passed"
    if outcome == "failed":
        s.subtests_failed += 1
        s.failed += 1
        return "failed"
    if outcome == "skipped":
        s.subtests_skipped += 1
        counter = "xfailed" if entry.get("wasxfail") is not None else "skipped"
        setattr(s, counter, getattr(s, counter) + 1)
        return counter
    return None


def _collected(entry: dict[str, Any], tally: _Tally) -> None:
    """A module that failed to collect is an error, one skipped at collection a skip."""
    if entry.get("outcome") == "failed":
        tally.s.tests += 1
        tally.s.errors += 1
        _detail(entry, "errors", tally)
    elif entry.get("outcome") == "skipped":
        tally.s.tests += 1
        tally.s.skipped += 1
        _detail(entry, "skipped", tally)


def _detail(entry: dict[str, Any], counter: str | None, tally: _Tally) -> None:
    """What the JUnit file would have said of this report: a failure's text, a skip's reason,
    the test's time."""
    nodeid = str(entry.get("nodeid", ""))
    seconds = _float(str(entry.get("duration", 0)))
    tally.case_time += seconds
    if entry.get("when") == "call" and seconds > tally.slow_floor():
        tally.time_of(nodeid, seconds)
    if counter == "skipped":
        reason = str(entry.get("reason", ""))
        tally.add_skip_reason(skip_reason(reason, "") if reason else "(no reason given)")
    elif counter in ("failed", "errors"):
        tally.add_report_failure(entry, "failure" if counter == "failed" else "error")


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
