"""A run's results against the default branch's history: each failed test new, already
failing, flaky or never seen; skips, XPASSes and slow tests against the same baseline. Pure."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Generic, TypeVar

from contract.checks import Conclusion, Verdict, fit_markdown, inline
from contract.outcomes import FAILING, Outcome
from contract.results import RunReport

K = TypeVar("K", bound=Hashable)  # how the caller names a test (the store: its interned number)
PASSING = frozenset((Outcome.PASSED, Outcome.XPASSED))
STRICT = "strict"
NEW_FAILURES = "new_failures"
CONCLUSION_MODES = (STRICT, NEW_FAILURES)
ROWS_SHOWN = 100  # per list in the Check Run; the title's counts and the run page have all


@dataclass(frozen=True)
class Policy:
    """When a test counts as flaky, and when an XPASS is old enough to remove its marker."""

    flaky_flips: int = 3  # N: flips between pass and fail...
    flaky_window: int = 20  # K: ...within the last K baseline runs of the batch
    xpass_runs: int = 3  # consecutive baseline runs a non-strict XPASS passed in


@dataclass(frozen=True)
class BaselineRun(Generic[K]):
    """One earlier run of the batch on the default branch (a scheduled layer's run)."""

    sha: str
    at: float
    outcomes: Mapping[K, str]  # test -> Outcome letter
    skipped: int = 0
    seconds: Mapping[K, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Since:
    """The default branch's first failing run of a test's current streak of failures."""

    sha: str
    at: float


@dataclass(frozen=True)
class ThisRun(Generic[K]):
    """The run being judged: its failed and errored tests, and every test's outcome."""

    failed: Sequence[K]
    outcomes: Mapping[K, str]
    reruns: Mapping[K, int] = field(default_factory=dict)
    reasons: Mapping[K, str] = field(default_factory=dict)  # skipped tests: why
    skipped: int = 0


class FailureClass(StrEnum):
    NEW = "new"
    ALREADY_FAILING = "already failing"
    FLAKY = "flaky"
    NO_HISTORY = "no history"

    @property
    def blocking(self) -> bool:
        """Fails the run under `conclusion: new_failures` (a test never seen may be new)."""
        return self in (FailureClass.NEW, FailureClass.NO_HISTORY)


@dataclass(frozen=True)
class Classified(Generic[K]):
    test: K
    kind: FailureClass
    why: str


@dataclass(frozen=True)
class Classification(Generic[K]):
    failures: list[Classified[K]]
    rerun_passes: list[K]  # passed only on a rerun in this run: flaky, but not failing
    newly_skipped: list[tuple[K, str]]  # skipped here, passed on the default branch: why
    stale_xfails: list[tuple[K, int]]  # XPASS here and in that many baseline runs in a row
    skipped: int
    baseline_skipped: int | None  # the default branch's latest run of the batch
    baseline_runs: int

    def count(self, kind: FailureClass) -> int:
        return sum(1 for f in self.failures if f.kind is kind)


def classify(
    this: ThisRun[K],
    baseline: Sequence[BaselineRun[K]],
    since: Mapping[K, Since],
    policy: Policy = Policy(),
) -> Classification[K]:
    """`baseline` newest first; `since` the failing streaks the history tracks."""
    window = baseline[: policy.flaky_window]
    return Classification(
        failures=[_classify_failure(t, this, window, since, policy) for t in this.failed],
        rerun_passes=[t for t, n in this.reruns.items() if n and this.outcomes.get(t) in PASSING],
        newly_skipped=[
            (t, this.reasons.get(t, "(no reason given)"))
            for t, o in this.outcomes.items()
            if o == Outcome.SKIPPED and _latest(t, window) in PASSING
        ],
        stale_xfails=[
            (t, n)
            for t, o in this.outcomes.items()
            if o == Outcome.XPASSED and (n := _xpass_streak(t, window)) >= policy.xpass_runs
        ],
        skipped=this.skipped,
        baseline_skipped=window[0].skipped if window else None,
        baseline_runs=len(window),
    )


def _classify_failure(
    test: K,
    this: ThisRun[K],
    window: Sequence[BaselineRun[K]],
    since: Mapping[K, Since],
    policy: Policy,
) -> Classified[K]:
    seen = [(run, run.outcomes[test]) for run in window if test in run.outcomes]
    if not seen:
        return Classified(test, FailureClass.NO_HISTORY, "never seen on the default branch")
    flips = _flips([outcome for _, outcome in seen])
    if flips >= policy.flaky_flips:
        return Classified(
            test, FailureClass.FLAKY, f"flipped {flips} times in the last {len(window)} runs"
        )
    latest_run, latest = seen[0]
    if latest in FAILING:
        start = since.get(test) or _streak_start(seen)
        return Classified(
            test, FailureClass.ALREADY_FAILING, f"failing since {start.sha[:12]} ({_day(start.at)})"
        )
    word = "passed" if latest in PASSING else "skipped or xfailed"
    return Classified(test, FailureClass.NEW, f"{word} at {latest_run.sha[:12]}")


def _flips(outcomes: Sequence[str]) -> int:
    """Changes between passing and failing, skips left out."""
    states = [o in FAILING for o in outcomes if o in FAILING or o in PASSING]
    return sum(1 for a, b in itertools.pairwise(states) if a != b)


def _streak_start(seen: Sequence[tuple[BaselineRun[K], str]]) -> Since:
    """The oldest run of the newest unbroken run of failures (the window's view of it)."""
    start = seen[0][0]
    for run, outcome in seen:
        if outcome not in FAILING:
            break
        start = run
    return Since(start.sha, start.at)


def _latest(test: K, window: Sequence[BaselineRun[K]]) -> str | None:
    return next((run.outcomes[test] for run in window if test in run.outcomes), None)


def _xpass_streak(test: K, window: Sequence[BaselineRun[K]]) -> int:
    streak = 0
    for run in window:
        if run.outcomes.get(test) != Outcome.XPASSED:
            break
        streak += 1
    return streak


def _day(at: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(at))


# --- slow tests against the baseline ----------------------------------------------------------


def slow_medians(
    slowest: Sequence[tuple[K, float]], baseline: Sequence[BaselineRun[K]]
) -> list[tuple[K, float, float | None]]:
    """The run's slowest tests with their median seconds on the default branch (None: unseen)."""
    out = []
    for test, seconds in slowest:
        past = [run.seconds[test] for run in baseline if test in run.seconds]
        out.append((test, seconds, statistics.median(past) if past else None))
    return out


# --- what the Check Run says -------------------------------------------------------------------


def title_prefix(c: Classification[K]) -> str:
    """ "2 new failures; 1 already failing on the default branch; 1 flaky"."""
    on_main = "already failing on the default branch"
    counts = [
        (c.count(FailureClass.NEW), "new failure", "new failures"),
        (c.count(FailureClass.ALREADY_FAILING), on_main, on_main),
        (c.count(FailureClass.FLAKY) + len(c.rerun_passes), "flaky", "flaky"),
        (c.count(FailureClass.NO_HISTORY), "with no history", "with no history"),
    ]
    return "; ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts if n)


def history_section(c: Classification[K], names: Mapping[K, str]) -> str:
    """The Check Run's "Against the default branch" section; "" when there is nothing to say."""
    lines = _failure_table(c, names) + _notes(c, names)
    if not lines:
        return ""
    where = f"the last {c.baseline_runs} runs" if c.baseline_runs else "no runs yet"
    return f"### Against the default branch ({where})\n\n" + "\n".join(lines) + "\n"


def _failure_table(c: Classification[K], names: Mapping[K, str]) -> list[str]:
    """The failures, new ones first, at most ROWS_SHOWN."""
    if not c.failures:
        return []
    shown = sorted(c.failures, key=lambda f: _ORDER.index(f.kind))[:ROWS_SHOWN]
    rows = [f"| {inline(names[f.test])} | {f.kind.value} | {inline(f.why)} |" for f in shown]
    lines = ["| failed test | class | why |", "|---|---|---|", *rows, ""]
    if len(c.failures) > len(shown):
        more = len(c.failures) - len(shown)
        lines += [f"{more} more failures not listed here; the run page lists them all.", ""]
    return lines


def _notes(c: Classification[K], names: Mapping[K, str]) -> list[str]:
    """Flaky passes, tests newly skipped, XPASSes to unmark, the skip count."""
    reruns = [f"- {inline(names[t])}: flaky, passed on a rerun in this run" for t in c.rerun_passes]
    skips = [
        f"- {inline(names[t])}: skipped here ({inline(why)}), passed on the default branch"
        for t, why in c.newly_skipped
    ]
    xpasses = [
        f"- {inline(names[t])}: XPASS here and in the default branch's last {n} runs:"
        " remove the xfail marker"
        for t, n in c.stale_xfails
    ]
    lines = _capped(reruns, "flaky passes") + _capped(skips, "newly skipped tests")
    lines += _capped(xpasses, "such XPASSes")
    if c.baseline_skipped is not None and c.skipped != c.baseline_skipped:
        lines.append(
            f"- {c.skipped} skipped; the default branch's latest run skipped {c.baseline_skipped}"
        )
    return lines


def _capped(lines: list[str], what: str) -> list[str]:
    """At most ROWS_SHOWN lines, then how many more there are."""
    more = len(lines) - ROWS_SHOWN
    if more <= 0:
        return lines
    return [*lines[:ROWS_SHOWN], f"- and {more} more {what} (the run page lists them all)"]


_ORDER = [
    FailureClass.NEW,
    FailureClass.NO_HISTORY,
    FailureClass.ALREADY_FAILING,
    FailureClass.FLAKY,
]


def against_history(
    verdict: Verdict,
    report: RunReport,
    c: Classification[K],
    names: Mapping[K, str],
    *,
    batch: str,
    mode: str = STRICT,
) -> Verdict:
    """The verdict with the history's view: the title leads with the failures' classes, the
    summary gets the history section after its heading, and under `new_failures` a run whose
    failures are all known (already failing, flaky) is neutral instead of failed. With no
    baseline run at all (a batch never run on the default branch) there is nothing to compare
    and the verdict stays as it was."""
    if not c.baseline_runs:
        return verdict
    prefix, section = title_prefix(c), history_section(c, names)
    conclusion, title = verdict.conclusion, verdict.title
    if _only_known_failures(verdict, report, c) and mode == NEW_FAILURES:
        conclusion = Conclusion.NEUTRAL
        section = (
            "**Neutral** (`conclusion: new_failures`): every failure is already failing on the"
            " default branch or flaky.\n\n" + section
        )
    if prefix:
        title = _short(f"{prefix} · {title}")
    if title == verdict.title and not section and conclusion is verdict.conclusion:
        return verdict
    summary = _with_section(verdict.output.summary, batch, verdict.title, title, section)
    output = replace(verdict.output, title=title, summary=summary)
    data = {**verdict.data, "conclusion": str(conclusion), "title": title}
    data["history"] = classification_json(c, names)
    return Verdict(conclusion, title, output, data)


def _only_known_failures(verdict: Verdict, report: RunReport, c: Classification[K]) -> bool:
    """Failed because of tests alone, every one of them classified and none of them new."""
    return (
        verdict.conclusion is Conclusion.FAILURE
        and report.error is None
        and not report.summary.failures_dropped
        and bool(c.failures)
        and not any(f.kind.blocking for f in c.failures)
    )


def _with_section(summary: str, batch: str, old: str, new: str, section: str) -> str:
    """The summary with its heading retitled and `section` right after it."""
    head = f"## gpuci / batch {inline(batch)}: {inline(old)}\n"
    rest = summary[len(head) + 1 :] if summary.startswith(head) else summary
    return fit_markdown([f"## gpuci / batch {inline(batch)}: {inline(new)}\n", section, rest])


def _short(title: str) -> str:
    return title if len(title) <= 255 else title[:254] + "…"


def classification_json(c: Classification[K], names: Mapping[K, str]) -> dict[str, object]:
    """The classification as the run page and `gpuci history --json` show it."""
    return {
        "failures": [
            {"test_id": names[f.test], "class": f.kind.value, "why": f.why} for f in c.failures
        ],
        "rerun_passes": [names[t] for t in c.rerun_passes],
        "newly_skipped": [{"test_id": names[t], "reason": why} for t, why in c.newly_skipped],
        "stale_xfails": [{"test_id": names[t], "runs": n} for t, n in c.stale_xfails],
        "skipped": c.skipped,
        "baseline_skipped": c.baseline_skipped,
        "baseline_runs": c.baseline_runs,
    }
