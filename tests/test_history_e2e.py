"""The test history through the whole stack on fakehub: scheduled runs on the default branch
make the baseline, and a PR's Check Run names each failure's class against it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from redis import Redis

from app import create_app
from bot import charts, history, runs
from bot.github_app import GitHubApp
from bot.scheduler import Schedules
from contract import keys
from contract.checks import inline
from contract.settings import Settings
from tests.conftest import Stack, serve_stack
from tests.test_e2e import HOST, run_everything

WORLD = Path(__file__).parent / "data" / "world-history.yml"
REPO = "acme/hist"
PLAN = "tests/plan.json"
# The default branch's commits, oldest first: what tests/plan.json makes fail there.
MAIN = [
    {},
    {"broken": "f"},
    {"broken": "f", "flaky": "f"},
    {"broken": "f"},
    {"broken": "f", "flaky": "f"},
]
KEPT = 4  # GPUCI_HISTORY_DEFAULT_RUNS here: the fifth run pushes the first out


@pytest.fixture
def hist(
    redis_conn: Redis, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stack]:
    with serve_stack(WORLD, redis_conn, redis_url, tmp_path, monkeypatch) as found:
        monkeypatch.setenv("GPUCI_HOST", HOST)
        monkeypatch.setenv("GPUCI_GPU_BACKEND", "sim:8xH20-96GB")
        monkeypatch.setenv("GPUCI_WORK_DIR", str(tmp_path / "runs"))
        monkeypatch.setenv("GPUCI_IDLE_SAMPLE_INTERVAL_S", "0")
        monkeypatch.setenv("GPUCI_HISTORY_DEFAULT_RUNS", str(KEPT))
        yield found


def push_main(stack: Stack, files: dict[str, str]) -> str:
    answer = stack.control(
        "POST", f"repos/{REPO}/branches/main/push", {"user": "maya", "files": files}
    )
    return str(answer["sha"])


def scheduled_run(stack: Stack, minute: int) -> str:
    """Layer 3 fires for the default branch's head (its config read afresh), and runs."""
    schedules = Schedules(stack.redis, GitHubApp.from_settings(Settings.from_env()))
    (run_id,) = schedules.fire(datetime(2026, 12, 7, 3, minute, tzinfo=UTC))
    run_everything(stack)
    return run_id


def open_pr(stack: Stack, ref: str, files: dict[str, str]) -> dict[str, object]:
    body = {"repo": REPO, "author": "maya", "head": {"ref": ref, "files": files}}
    found = stack.control("POST", "pulls", body)
    run_everything(stack)
    return found["pull"]  # type: ignore[no-any-return]


def test_check_runs_name_each_failures_class_against_the_default_branch(hist: Stack) -> None:
    # gpuci knows the repository's installation, as it does once it heard from it
    hist.redis.hset(keys.repos(), REPO, 302)
    main_checks = []
    for minute, plan in enumerate(MAIN):
        files = {PLAN: json.dumps(plan)}
        if minute == len(MAIN) - 1:  # the project opts into new_failures on its last commit
            config = (Path(__file__).parent / "data/history-repo/.gpuci.yml").read_text()
            files[".gpuci.yml"] = config + "conclusion: new_failures\n"
        sha = push_main(hist, files)
        scheduled_run(hist, minute)
        main_checks.append(hist.checks(sha)["gpuci / batch unit"])

    # the default branch's own runs are judged against their predecessors, strictly
    assert main_checks[1]["conclusion"] == "failure"
    assert main_checks[1]["output"]["title"].startswith("1 new failure · 1 failed")
    assert main_checks[2]["conclusion"] == "failure"  # strict: already failing still fails
    assert main_checks[2]["output"]["title"].startswith(
        "1 new failure; 1 already failing on the default branch · "
    )
    # the history stays within its bound: KEPT runs, their records and no others
    assert history.run_count(hist.redis, REPO, "unit") == KEPT
    records = hist.redis.keys(keys.history_record_prefix(REPO) + "*")
    assert len(records) == KEPT

    # a PR that regresses one test, skips another, adds a failing one
    pr = open_pr(
        hist,
        "regression",
        {
            PLAN: json.dumps({**MAIN[-1], "regress": "f", "multi_gpu": "s"}),
            "tests/test_added.py": "def test_added():\n    assert False, 'new and broken'\n",
        },
    )
    check = hist.checks(str(pr["head_sha"]))["gpuci / batch unit"]
    output = check["output"]
    assert check["conclusion"] == "failure"  # a new failure fails under new_failures too
    assert output["title"].startswith(
        "1 new failure; 1 already failing on the default branch; 1 flaky; 1 with no history · "
    ), output["title"]
    summary = output["summary"]
    assert "### Against the default branch (the last 4 runs)" in summary
    second = push_sha(hist, 1)
    assert f"failing since {second[:12]}" in summary  # the streak began at the second commit
    assert "flipped 3 times in the last 4 runs" in summary
    assert f"| {inline('tests/test_added.py::test_added')} | no history |" in summary
    assert f"| {inline('tests/test_lib.py::test_regress')} | new |" in summary
    assert "skipped here (needs 2 GPUs), passed on the default branch" in summary
    assert "XPASS here and in the default branch's last 4 runs: remove the xfail marker" in summary
    assert "1 skipped; the default branch's latest run skipped 0" in summary

    # a PR whose failures are all known: neutral under new_failures, saying why
    quiet = open_pr(hist, "docs", {"README.md": "docs only\n"})
    check = hist.checks(str(quiet["head_sha"]))["gpuci / batch unit"]
    assert check["conclusion"] == "neutral", check["output"]["title"]
    assert check["output"]["title"].startswith(
        "1 already failing on the default branch; 1 flaky · 2 failed"
    )
    assert "**Neutral** (`conclusion: new_failures`)" in check["output"]["summary"]
    # PR runs are kept per PR, and leave the default branch's history alone
    assert history.run_count(hist.redis, REPO, "unit", f"pr:{quiet['number']}") == 1
    assert history.run_count(hist.redis, REPO, "unit") == KEPT
    dashboard_shows_the_history(hist, int(str(pr["number"])))


def dashboard_shows_the_history(stack: Stack, number: int) -> None:
    """The run page links each test it names to the test's page; the test's page draws its
    outcomes as a strip, the batch's its durations (SVG, no script)."""
    web = create_app(Settings(public_repos="acme/*"), stack.redis).test_client()
    (run,) = runs.runs_of_pr(stack.redis, REPO, number)
    page = web.get(f"/runs/{run.run_id}").get_data(as_text=True)
    regress = "/history/acme/hist/unit/tests/tests/test_lib.py::test_regress"
    for test in (
        "test_lib.py::test_regress",
        "test_added.py::test_added",
        "test_lib.py::test_xpass",
    ):
        assert f'href="/history/acme/hist/unit/tests/tests/{test}"' in page, test
    assert "new: passed at" in page
    assert 'href="/history/acme/hist/unit"' in page and "<polyline" in page  # the trend

    test_page = web.get("/history/acme/hist/unit/tests/tests/test_lib.py::test_flaky")
    assert test_page.status_code == 200
    body = test_page.get_data(as_text=True)
    strip = body.split("<svg", 1)[1].split("</svg>", 1)[0]
    colours = re.findall(r'fill="(#[0-9a-f]{6})"', strip)
    passed, failed = charts.OUTCOME_STYLE["p"][0], charts.OUTCOME_STYLE["f"][0]
    assert colours == [passed, failed, passed, failed]  # the last 4 runs, oldest first
    assert "script" not in test_page.headers["Content-Security-Policy"].replace("'none'", "")
    assert "<script" not in body

    batch_page = web.get("/history/acme/hist/unit").get_data(as_text=True)
    assert batch_page.count("<circle") == KEPT
    assert 'href="/history/acme/hist/unit/tests/tests/test_lib.py::test_broken"' in batch_page
    assert web.get(regress).status_code == 200
    # a private repository's history is not shown; a malformed name is a clear 404
    private = create_app(Settings(), stack.redis).test_client()
    assert private.get("/history/acme/hist/unit").status_code == 403
    assert web.get("/history/acme/hist/un%20it").status_code == 404


def push_sha(stack: Stack, index: int) -> str:
    """The sha of the default branch's commit `index` (0: the first pushed here)."""
    found = [
        r.sha for r in sorted(runs.runs_of_pr(stack.redis, REPO, 0), key=lambda r: r.created_at)
    ]
    return found[index]
