"""The test history: each test's outcome from a real pytest run, kept in a real Redis within
its bounds, and read back as the baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from bot import charts, cli, history
from bot.classify import Policy
from bot.runs import Run, RunState, RunTrigger
from contract import keys
from contract.checks import judge
from contract.outcomes import TestOutcome
from contract.results import Failure, RunReport, Summary
from tests.test_junit import OUTCOMES, run_suite
from workers.junit import parse_junit
from workers.outcomes import read_outcomes

CASES = "tests/test_outcomes.py::"


def test_each_test_gets_the_outcome_pytest_reports(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, OUTCOMES, "--reruns", "1")

    found = {t.test_id.removeprefix(CASES): t for t in read_outcomes(ran.report)}

    outcomes = {name: t.outcome for name, t in found.items()}
    assert outcomes["test_pass"] == "p"
    assert outcomes["test_fail"] == "f"
    assert outcomes["TestOptimizer::test_diverges"] == "f"
    assert outcomes["test_four_gpus_a"] == "s"
    assert outcomes["test_xfail_mark"] == outcomes["test_xfail_call"] == "x"
    assert outcomes["test_xpass"] == "X"
    assert outcomes["test_xpass_strict"] == "f"
    assert outcomes["test_setup_error"] == outcomes["test_teardown_error"] == "e"
    assert outcomes["test_fail_and_teardown_error"] == "f"
    assert (outcomes["test_flaky"], found["test_flaky"].reruns) == ("p", 1)
    assert found["test_fail"].reruns == 1  # rerun once, failed again
    assert found["test_four_gpus_a"].reason == "needs 4 GPUs"
    assert found["test_runtime_skip"].reason == "FlashAttention-2 not installed"
    # one outcome per test, as many as pytest counts but the module skipped at collection
    # (test_module_skip.py: JUnit alone has it, and a module is no test to follow)
    summary = parse_junit([ran.junit], ran.report)
    assert len(found) == summary.tests - 1
    assert sum(1 for o in outcomes.values() if o == "s") == summary.skipped - 1


def test_no_report_means_no_outcomes(tmp_path: Path) -> None:
    assert read_outcomes(None) == []
    assert read_outcomes(tmp_path / "missing.jsonl") == []
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert read_outcomes(tmp_path / "bad.jsonl") == []


def test_the_report_carries_the_outcomes_through_json() -> None:
    tests = [TestOutcome("t::a", "p", 0.25), TestOutcome("t::b", "s", 0.0, 0, "no GPU")]
    tests.append(TestOutcome("t::c", "f", 1.5, 2))
    report = RunReport(summary=Summary(tests=3), tests=tests)

    assert RunReport.from_json(report.to_json()).tests == tests


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"ids": ["a"], "outcomes": "q", "ms": [1]}, "one letter"),
        ({"ids": ["a"], "outcomes": "pp", "ms": [1]}, "one letter"),
        ({"ids": [""], "outcomes": "p", "ms": [1]}, "tests.ids"),
        ({"ids": ["a"], "outcomes": "p", "ms": [-1]}, "milliseconds"),
        ({"ids": ["a"], "outcomes": "p", "ms": [1], "reruns": {"5": 1}}, "not the index"),
        ({"ids": ["a"], "outcomes": "p", "ms": [1], "reasons": {"0": 3}}, "values must be str"),
        ([1, 2], "object of columns"),
    ],
)
def test_a_malformed_test_list_is_refused_saying_which_column(
    columns: object, message: str
) -> None:
    data = RunReport(summary=Summary()).to_json()
    data["tests"] = columns
    with pytest.raises(ValueError, match=message):
        RunReport.from_json(data)


def _run(run_id: str, pr: int = 0, batch: str = "cpu") -> Run:
    return Run(
        run_id=run_id, repo="acme/Lib", installation_id=1, pr=pr, sha=(run_id * 40)[:40],
        batch=batch, trigger=RunTrigger.SCHEDULE, requested_by="", state=RunState.RUNNING,
        created_at=0.0, updated_at=0.0, host="h1",
    )  # fmt: skip


def _record(conn: Redis, run: Run, outcomes: dict[str, str], bounds: history.Bounds) -> str:
    failures = [Failure(t, "failure", "x") for t, o in outcomes.items() if o == "f"]
    tests = [TestOutcome(t, o, 0.5) for t, o in outcomes.items()]
    summary = Summary(tests=len(tests), passed=len(tests) - len(failures), failed=len(failures))
    summary.failures = failures
    report = RunReport(summary=summary, tests=tests)
    verdict = judge(report, batch=run.batch, allow_no_tests=False, sha=run.sha, host="h1")
    judged = history.judge_with_history(
        conn, run, report, verdict, mode="strict", policy=Policy(), bounds=bounds
    )
    return judged.title


def test_the_history_stays_within_its_bounds(redis_conn: Redis) -> None:
    bounds = history.Bounds(default_runs=5, pr_runs=2)
    for n in range(1, 13):
        _record(redis_conn, _run(str(n)), {"t::a": "p", f"t::new{n % 3}": "p"}, bounds)
        _record(redis_conn, _run(f"{100 + n}", pr=7), {"t::a": "p"}, bounds)

    assert history.run_count(redis_conn, "acme/lib", "cpu") == 5
    assert history.run_count(redis_conn, "acme/lib", "cpu", "pr:7") == 2
    records = redis_conn.keys(keys.history_record_prefix("acme/lib") + "*")
    assert len(records) == 7  # the runs that fell off are deleted with their lists' entries
    assert [e["run"] for e in history.trend(redis_conn, "acme/lib", "cpu")] == [
        "12", "11", "10", "9", "8"
    ]  # fmt: skip
    # a record holds no test id: numbers in a layout shared by the runs with the same tests
    packed = redis_conn.get(records[0])
    assert isinstance(packed, bytes) and b"t::a" not in packed
    # three layouts on the default branch ({a, new0}, {a, new1}, {a, new2}) kept while used,
    # and the PR's {a} for the PR's time
    layouts = [redis_conn.ttl(k) for k in redis_conn.keys(keys.history_layout("acme/lib", "*"))]
    assert sorted(layouts)[:3] == [-1, -1, -1]
    assert 0 < sorted(layouts)[3] <= bounds.pr_ttl_s
    uses = redis_conn.hgetall(keys.history_layout_uses("acme/lib"))
    assert sorted(int(n) for n in uses.values()) == [1, 2, 2]  # the 5 default-branch records
    assert redis_conn.ttl(keys.history_runs("acme/lib", "cpu", "pr:7")) > 0
    assert redis_conn.ttl(keys.history_runs("acme/lib", "cpu", "default")) == -1


def test_a_layout_no_record_uses_is_deleted(redis_conn: Redis) -> None:
    bounds = history.Bounds(default_runs=2)
    _record(redis_conn, _run("1"), {"t::old": "p"}, bounds)
    _record(redis_conn, _run("2"), {"t::new": "p"}, bounds)
    _record(redis_conn, _run("3"), {"t::new": "p"}, bounds)  # run 1 and its layout go
    _record(redis_conn, _run("3"), {"t::new": "p"}, bounds)  # a message applied twice

    assert len(redis_conn.keys(keys.history_layout("acme/lib", "*"))) == 1
    assert list(redis_conn.hgetall(keys.history_layout_uses("acme/lib")).values()) == [b"2"]
    assert history.run_count(redis_conn, "acme/lib", "cpu") == 2


def test_failing_streaks_start_and_end_on_the_default_branch(redis_conn: Redis) -> None:
    bounds = history.Bounds()
    _record(redis_conn, _run("1"), {"t::a": "p", "t::b": "p"}, bounds)
    _record(redis_conn, _run("2"), {"t::a": "f", "t::b": "p"}, bounds)
    title = _record(redis_conn, _run("3"), {"t::a": "f", "t::b": "f"}, bounds)

    assert title.startswith("1 new failure; 1 already failing on the default branch · ")
    _, since = history.read_baseline(redis_conn, "acme/lib", "cpu", 20)
    names = ["t::a", "t::b"]
    numbers = dict(zip(names, history.test_numbers(names), strict=True))
    assert since[numbers["t::a"]].sha == _run("2").sha  # since run 2, not 3
    _record(redis_conn, _run("4"), {"t::a": "p", "t::b": "f"}, bounds)
    _, since = history.read_baseline(redis_conn, "acme/lib", "cpu", 20)
    assert set(since) == {numbers["t::b"]}  # a passed again: its streak ended
    # a PR's run changes no streak
    _record(redis_conn, _run("5", pr=3), {"t::a": "f", "t::b": "p"}, bounds)
    assert set(history.read_baseline(redis_conn, "acme/lib", "cpu", 20)[1]) == {numbers["t::b"]}


def test_a_test_page_reads_its_outcomes_newest_first(redis_conn: Redis) -> None:
    bounds = history.Bounds()
    for n, outcome in enumerate("ppfs", start=1):
        _record(redis_conn, _run(str(n)), {"t::a": outcome, "t::b": "p"}, bounds)
    _record(redis_conn, _run("9"), {"t::b": "p"}, bounds)

    strip = history.test_history(redis_conn, "acme/lib", "cpu", "t::a")

    assert [e["outcome"] for e in strip] == ["-", "s", "f", "p", "p"]
    assert strip[1]["seconds"] == 0.5


def test_the_pictures_escape_what_they_show() -> None:
    strip = charts.outcome_strip([charts.Cell("f", "<script>x</script>"), charts.Cell("?", "r")])
    plot = charts.duration_plot([("<b>", 1.0), ("run 2", 3.0)])

    assert "<script>" not in strip and "&lt;script&gt;" in strip
    assert strip.count("<rect") == 2 and "not run: r" in strip  # an unknown letter: not run
    assert "&lt;b&gt;: 1.0 s" in plot and "3.0 s" in plot
    assert charts.duration_plot([]) == ""


def test_gpuci_history_prints_a_batch_and_a_test(
    redis_conn: Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    for n, outcome in enumerate("pfsf", start=1):
        _record(redis_conn, _run(str(n)), {"t::a": outcome, "t::b": "p"}, history.Bounds())

    assert cli.main(["history", "acme/lib", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "acme/lib batch cpu: 4 runs on the default branch, oldest first" in text
    assert "t::a  since 222222222222" in text  # since run 2: a skip does not end a streak
    assert cli.main(["history", "acme/lib", "cpu", "t::a"]) == 0
    assert "  pfsf   (p passed" in capsys.readouterr().out
    assert cli.main(["history", "acme/lib", "cpu", "t::a", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [r["outcome"] for r in found["runs"]] == ["p", "f", "s", "f"]
    assert cli.main(["history", "not-a-repo", "cpu"]) == 2
    assert "give owner/name" in capsys.readouterr().err


def test_the_slowest_tests_get_their_median_on_the_default_branch(redis_conn: Redis) -> None:
    for n, seconds in enumerate((1.0, 2.0, 9.0), start=1):
        tests = [TestOutcome("t::slow", "p", seconds), TestOutcome("t::quick", "p", 0.01)]
        report = RunReport(summary=Summary(tests=2, passed=2), tests=tests)
        verdict = judge(report, batch="cpu", allow_no_tests=False, sha="s" * 40, host="h1")
        history.judge_with_history(
            redis_conn, _run(str(n)), report, verdict, mode="strict", policy=Policy(),
            bounds=history.Bounds(),
        )  # fmt: skip
    tests = [TestOutcome("t::slow", "p", 5.0), TestOutcome("t::new", "p", 4.0)]
    summary = Summary(tests=2, passed=2, slowest=[("t::slow", 5.0), ("t::new", 4.0)])
    report = RunReport(summary=summary, tests=tests)
    verdict = judge(report, batch="cpu", allow_no_tests=False, sha="s" * 40, host="h1")

    judged = history.judge_with_history(
        redis_conn, _run("9", pr=4), report, verdict, mode="strict", policy=Policy(),
        bounds=history.Bounds(),
    )  # fmt: skip

    assert judged.data["history"]["slowest"] == [["t::slow", 5.0, 2.0], ["t::new", 4.0, None]]


def test_an_unreadable_entry_is_left_out_not_fatal(redis_conn: Redis) -> None:
    bounds = history.Bounds()
    _record(redis_conn, _run("1"), {"t::a": "f"}, bounds)
    redis_conn.hset(keys.history_failing("acme/lib", "cpu"), "12", "{not json")
    redis_conn.set(keys.history_record("acme/lib", "0"), b"\x00garbage")
    redis_conn.rpush(keys.history_runs("acme/lib", "cpu", "default"), "0")

    runs, since = history.read_baseline(redis_conn, "acme/lib", "cpu", 20)

    assert len(runs) == 1 and len(since) == 1
    assert _record(redis_conn, _run("2"), {"t::a": "f"}, bounds).startswith("1 already failing")


def test_a_run_applied_twice_is_not_its_own_baseline(redis_conn: Redis) -> None:
    bounds = history.Bounds()
    _record(redis_conn, _run("1"), {"t::a": "p"}, bounds)
    first = _record(redis_conn, _run("2"), {"t::a": "f"}, bounds)
    again = _record(redis_conn, _run("2"), {"t::a": "f"}, bounds)  # the message applied again

    assert first == again
    assert again.startswith("1 new failure · ")
    assert history.run_count(redis_conn, "acme/lib", "cpu") == 2
    runs, _ = history.read_baseline(redis_conn, "acme/lib", "cpu", 1)
    assert [r.sha for r in runs] == [_run("2").sha]  # the limit holds with nothing excluded
