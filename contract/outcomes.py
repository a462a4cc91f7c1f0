"""Each test's own outcome in a run (the test history's input), as compact JSON columns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_TESTS = 100_000  # tests a run report may list one by one; more are not recorded
MAX_ID_CHARS = 4000
MAX_REASON_CHARS = 1000


class Outcome:
    """One letter per outcome, as the history stores them."""

    PASSED = "p"
    FAILED = "f"
    ERROR = "e"
    SKIPPED = "s"
    XFAILED = "x"
    XPASSED = "X"


OUTCOMES = frozenset("pfesxX")
FAILING = frozenset("fe")


@dataclass(frozen=True)
class TestOutcome:
    """How one test ended (its last attempt), how long all its attempts took, how often it
    was rerun, and why it was skipped."""

    __test__ = False  # not a test class, whatever pytest makes of its name

    test_id: str
    outcome: str  # an Outcome letter
    seconds: float = 0.0
    reruns: int = 0
    reason: str = ""  # skipped: the skip reason


def to_columns(tests: list[TestOutcome]) -> dict[str, object]:
    """Columns rather than objects: a run of 10,000 tests stays a few hundred KB of JSON."""
    return {
        "ids": [t.test_id for t in tests],
        "outcomes": "".join(t.outcome for t in tests),
        "ms": [round(t.seconds * 1000) for t in tests],
        "reruns": {str(i): t.reruns for i, t in enumerate(tests) if t.reruns},
        "reasons": {str(i): t.reason for i, t in enumerate(tests) if t.reason},
    }


def from_columns(data: object) -> list[TestOutcome]:
    """The tests in `data`, every column checked (ValueError says which)."""
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ValueError("tests must be an object of columns")
    ids, outcomes, ms = data.get("ids"), data.get("outcomes"), data.get("ms")
    if not isinstance(ids, list) or len(ids) > MAX_TESTS:
        raise ValueError(f"tests.ids must be a list of at most {MAX_TESTS}")
    if not isinstance(outcomes, str) or len(outcomes) != len(ids) or set(outcomes) - OUTCOMES:
        raise ValueError("tests.outcomes must be one letter of 'pfesxX' per test")
    if not isinstance(ms, list) or len(ms) != len(ids):
        raise ValueError("tests.ms must be one whole number of milliseconds per test")
    for test_id in ids:
        if not isinstance(test_id, str) or not 0 < len(test_id) <= MAX_ID_CHARS:
            raise ValueError(f"tests.ids: each is text of 1 to {MAX_ID_CHARS} characters")
    for value in ms:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**12:
            raise ValueError("tests.ms: each is a whole number of milliseconds")
    reruns = _sparse(data.get("reruns"), len(ids), int, "reruns")
    reasons = _sparse(data.get("reasons"), len(ids), str, "reasons")
    return [
        TestOutcome(tid, outcome, ms[i] / 1000, reruns.get(i, 0), reasons.get(i, ""))
        for i, (tid, outcome) in enumerate(zip(ids, outcomes, strict=True))
    ]


def _sparse(data: object, size: int, kind: type, what: str) -> dict[int, Any]:
    """A column given only where it is set: {"index": value}."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"tests.{what} must be an object of index -> value")
    out: dict[int, Any] = {}
    for key, value in data.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < size):
            raise ValueError(f"tests.{what}: {key!r} is not the index of a test")
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"tests.{what}: values must be {kind.__name__}")
        if isinstance(value, int) and not 0 <= value <= 1000:
            raise ValueError(f"tests.{what}: a test is rerun 0 to 1000 times")
        if isinstance(value, str) and len(value) > MAX_REASON_CHARS:
            raise ValueError(f"tests.{what}: at most {MAX_REASON_CHARS} characters each")
        out[int(key)] = value
    return out
