"""The pure classification of a run's results against the default branch's history."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

import pytest

from bot.classify import (
    NEW_FAILURES,
    STRICT,
    BaselineRun,
    FailureClass,
    Policy,
    Since,
    ThisRun,
    against_history,
    classify,
    history_section,
    slow_medians,
    title_prefix,
)
from contract.checks import Conclusion, judge
from contract.results import Failure, RunReport, Summary

DAY = 86400.0
POLICY = Policy(flaky_flips=3, flaky_window=20, xpass_runs=3)


def baseline(*columns: str, tests: Sequence[str] = "abcd") -> list[BaselineRun[str]]:
    """Runs newest first; each column gives the outcome letter of tests a, b, c, d ('-': absent)."""
    return [
        BaselineRun(
            sha=str(i) * 40,
            at=1_800_000_000 - i * DAY,
            outcomes={t: o for t, o in zip(tests, column, strict=True) if o != "-"},
            skipped=column.count("s"),
        )
        for i, column in enumerate(columns)
    ]


def failing(*tests: str, **outcomes: str) -> ThisRun[str]:
    return ThisRun(failed=list(tests), outcomes={t: "f" for t in tests} | outcomes)


@pytest.mark.parametrize(
    ("history", "expected", "why"),
    [
        (["p", "p", "p"], FailureClass.NEW, "passed at 000000000000"),
        (["s", "p"], FailureClass.NEW, "skipped or xfailed at 000000000000"),
        (["f", "f", "p"], FailureClass.ALREADY_FAILING, "failing since 111111111111"),
        (["e", "p"], FailureClass.ALREADY_FAILING, "failing since"),
        (["p", "f", "p", "f", "p"], FailureClass.FLAKY, "flipped 4 times in the last 5 runs"),
        (["f", "p", "f", "p"], FailureClass.FLAKY, "flipped 3 times"),
        (["p", "f", "f", "p"], FailureClass.NEW, "passed"),  # broken once and fixed: 2 flips
        (["p", "s", "f", "s", "p", "f"], FailureClass.FLAKY, "flipped 3 times"),  # skips left out
        ([], FailureClass.NO_HISTORY, "never seen on the default branch"),
        (["-", "-"], FailureClass.NO_HISTORY, "never seen"),
    ],
)
def test_each_failure_gets_its_class(history: list[str], expected: FailureClass, why: str) -> None:
    runs = baseline(*(h + "ppp" for h in history))
    found = classify(failing("a"), runs, {}, POLICY)

    assert [f.kind for f in found.failures] == [expected]
    assert why in found.failures[0].why


def test_already_failing_names_the_streak_start_from_the_tracked_streaks() -> None:
    runs = baseline("fppp", "fppp", "pppp")
    tracked = {"a": Since("ab" * 20, 1_700_000_000.0)}

    found = classify(failing("a"), runs, tracked, POLICY)

    assert found.failures[0].why == "failing since abababababab (2023-11-14)"
    # without a tracked streak, the window's oldest failing run of the streak
    assert "failing since 111111111111" in classify(failing("a"), runs, {}, POLICY).failures[0].why


def test_flakiness_counts_only_the_last_k_runs() -> None:
    runs = baseline("pppp", "pppp", "pppp", "fppp", "pppp", "fppp", "pppp")
    narrow = classify(failing("a"), runs, {}, Policy(flaky_flips=3, flaky_window=3))
    wide = classify(failing("a"), runs, {}, Policy(flaky_flips=3, flaky_window=7))

    assert narrow.failures[0].kind is FailureClass.NEW
    assert wide.failures[0].kind is FailureClass.FLAKY
    assert "in the last 7 runs" in wide.failures[0].why


def test_a_pass_after_reruns_is_flaky_but_not_a_failure() -> None:
    this = ThisRun(failed=[], outcomes={"a": "p", "b": "p"}, reruns={"a": 2})

    found = classify(this, baseline("pppp"), {}, POLICY)

    assert found.failures == []
    assert found.rerun_passes == ["a"]
    assert title_prefix(found) == "1 flaky"


def test_a_test_skipped_here_but_passed_on_the_default_branch_is_listed_with_its_reason() -> None:
    this = ThisRun(
        failed=[],
        outcomes={"a": "s", "b": "s", "c": "p"},
        reasons={"a": "needs 2 GPUs", "b": "no NCCL"},
        skipped=2,
    )

    found = classify(this, baseline("psps"), {}, POLICY)

    assert found.newly_skipped == [("a", "needs 2 GPUs")]  # b was skipped there too
    assert (found.skipped, found.baseline_skipped) == (2, 2)
    section = history_section(found, {"a": "t::a", "b": "t::b", "c": "t::c"})
    assert "t::a: skipped here (needs 2 GPUs), passed on the default branch" in section


def test_an_xpass_that_passed_n_baseline_runs_in_a_row_says_remove_the_marker() -> None:
    this = ThisRun(failed=[], outcomes={"a": "X", "b": "X", "c": "p"})
    runs = baseline("XXpp", "XXpp", "Xxpp", "Xxpp")

    found = classify(this, runs, {}, POLICY)

    assert found.stale_xfails == [("a", 4)]  # b xfailed two runs ago: its streak is 2
    assert "remove the xfail marker" in history_section(found, {"a": "t::a"})


def test_the_skip_count_is_compared_with_the_latest_baseline_run() -> None:
    this = ThisRun(failed=[], outcomes={"a": "s", "b": "s", "c": "s"}, skipped=3)
    found = classify(this, baseline("sppp", "ssss"), {}, POLICY)

    assert (found.skipped, found.baseline_skipped) == (3, 1)
    assert "3 skipped; the default branch's latest run skipped 1" in history_section(
        found, {"a": "a", "b": "b", "c": "c"}
    )


def test_title_leads_with_what_matters() -> None:
    runs = baseline("ppfp", "ppfp", "ppfp", "pfpp", "pppf", "pfpp")
    this = failing("a", "b", "c", "d", "z")

    found = classify(this, runs, {}, POLICY)

    kinds = {f.test: f.kind for f in found.failures}
    assert kinds == {
        "a": FailureClass.NEW,
        "b": FailureClass.FLAKY,  # newest first p p p f p f: 3 flips
        "c": FailureClass.ALREADY_FAILING,
        "d": FailureClass.NEW,
        "z": FailureClass.NO_HISTORY,
    }
    assert title_prefix(found) == (
        "2 new failures; 1 already failing on the default branch; 1 flaky; 1 with no history"
    )


def _report(*failed: str) -> RunReport:
    failures = [Failure(t, "failure", "boom", file="tests/t.py", line=3) for t in failed]
    summary = Summary(tests=5, passed=5 - len(failed), failed=len(failed), failures=failures)
    return RunReport(summary=summary)


@pytest.mark.parametrize(
    ("mode", "history", "conclusion"),
    [
        (STRICT, "f", Conclusion.FAILURE),  # the default stays strict
        (NEW_FAILURES, "f", Conclusion.NEUTRAL),  # already failing: neutral, with the reason
        (NEW_FAILURES, "p", Conclusion.FAILURE),  # new: fails
        (NEW_FAILURES, "-", Conclusion.FAILURE),  # never seen: counts as new
    ],
)
def test_conclusion_new_failures_fails_only_for_new_failures(
    mode: str, history: str, conclusion: Conclusion
) -> None:
    report = _report("t::a")
    verdict = judge(report, batch="2", allow_no_tests=False, sha="a" * 40, host="h")
    found = classify(failing("t::a"), baseline(history, tests=["t::a"]), {})

    judged = against_history(verdict, report, found, {"t::a": "t::a"}, batch="2", mode=mode)

    assert judged.conclusion is conclusion
    assert judged.data["conclusion"] == str(conclusion)
    assert judged.title.endswith("1 failed, 4 passed")
    assert judged.output.summary.startswith(f"## gpuci / batch 2: {judged.title.split(' ')[0]}")
    if conclusion is Conclusion.NEUTRAL:
        assert "**Neutral** (`conclusion: new_failures`)" in judged.output.summary
        assert judged.title.startswith("1 already failing on the default branch · ")


def test_an_infrastructure_error_stays_a_failure_under_new_failures() -> None:
    report = _report("t::a")
    report.error = "pytest internal error (exit 3)"
    verdict = judge(report, batch="2", allow_no_tests=False, sha="a" * 40, host="h")
    found = classify(failing("t::a"), baseline("f", tests=["t::a"]), {})

    judged = against_history(verdict, report, found, {"t::a": "t::a"}, batch="2", mode=NEW_FAILURES)

    assert judged.conclusion is Conclusion.FAILURE


def test_nothing_to_say_leaves_the_verdict_as_it_was() -> None:
    report = RunReport(summary=Summary(tests=1, passed=1))
    verdict = judge(report, batch="cpu", allow_no_tests=False, sha="a" * 40, host="h")
    found = classify(ThisRun(failed=[], outcomes={"a": "p"}), baseline("pppp"), {})

    assert against_history(verdict, report, found, {"a": "a"}, batch="cpu") is verdict


def test_slowest_tests_get_their_baseline_median() -> None:
    runs = [BaselineRun("s" * 40, 0.0, {"a": "p"}, seconds={"a": seconds}) for seconds in (1, 2, 9)]

    assert slow_medians([("a", 4.0), ("b", 1.0)], runs) == [("a", 4.0, 2), ("b", 1.0, None)]


def test_the_classifier_is_pure() -> None:
    tree = ast.parse(Path("bot/classify.py").read_text())
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
    }

    assert not names & {"redis", "flask", "github", "rq", "subprocess", "workers"}


def test_without_any_baseline_run_the_verdict_stays_as_it_was() -> None:
    report = _report("t::a")
    verdict = judge(report, batch="2", allow_no_tests=False, sha="a" * 40, host="h")
    found = classify(failing("t::a"), [], {})

    assert found.failures[0].kind is FailureClass.NO_HISTORY
    judged = against_history(verdict, report, found, {"t::a": "t::a"}, batch="2", mode=NEW_FAILURES)
    assert judged is verdict


def test_long_lists_are_capped_with_how_many_more() -> None:
    tests = [f"t{i}" for i in range(150)]
    this = ThisRun(failed=tests, outcomes=dict.fromkeys(tests, "f"))
    runs = [BaselineRun("1" * 40, 0.0, dict.fromkeys(tests, "p"))]

    section = history_section(classify(this, runs, {}), {t: t for t in tests})

    assert section.count("| new |") == 100
    assert "50 more failures not listed here" in section
