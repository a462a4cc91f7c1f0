"""JUnit XML from pytest -> true counts, streamed and without entity expansion."""

from __future__ import annotations

from dataclasses import dataclass, field


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
