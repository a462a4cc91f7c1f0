"""Layer 3 on its cron schedule: runs at the default branch head, once per matching minute."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot import runs
from bot.github_app import GitHubApp
from bot.reporting import REPORTS_QUEUE
from bot.runs import RunState, RunTrigger
from bot.scheduler import Schedules
from contract import keys
from contract.config import cron_matches
from contract.settings import Settings
from tests.conftest import Stack
from tests.test_e2e import loop, run_everything  # noqa: F401  (loop is a fixture)

SATURDAY_16 = datetime(2026, 12, 5, 16, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "moment", "fires"),
    [
        ("0 16 * * 6", SATURDAY_16, True),
        ("0 16 * * 6", datetime(2026, 12, 5, 16, 1), False),
        ("0 16 * * 6", datetime(2026, 12, 6, 16, 0), False),
        ("*/15 * * * *", datetime(2026, 12, 2, 3, 45), True),
        ("*/15 * * * *", datetime(2026, 12, 2, 3, 44), False),
        ("0 9-17/4 * * 1-5", datetime(2026, 12, 2, 13, 0), True),
        ("0 9-17/4 * * 1-5", datetime(2026, 12, 2, 15, 0), False),
        ("30 2 1,15 * *", datetime(2026, 12, 15, 2, 30), True),
        ("0 0 * * 7", datetime(2026, 12, 6, 0, 0), True),  # 7 is Sunday too
        ("0 0 * * 0", datetime(2026, 12, 6, 0, 0), True),
        ("0 0 1 * 1", datetime(2026, 12, 7, 0, 0), True),  # both days restricted: either
        ("0 0 1 * 1", datetime(2026, 12, 1, 0, 0), True),
        ("0 0 1 * 1", datetime(2026, 12, 2, 0, 0), False),
        ("0 0 * 2 *", datetime(2026, 12, 1, 0, 0), False),
    ],
)
def test_cron_matches(expression: str, moment: datetime, fires: bool) -> None:
    assert cron_matches(expression, moment) is fires


def test_layer_3_fires_once_at_the_default_branch_head_and_runs(loop: Stack) -> None:  # noqa: F811
    loop.open_pr("maya", "faster-optimizer", repo="acme/sample")
    loop.process()  # gpuci heard from acme/sample: it knows the repository's installation
    assert loop.redis.hget(keys.repos(), "acme/sample") is not None
    schedules = Schedules(loop.redis, GitHubApp.from_settings(Settings.from_env()))
    created = schedules.fire(SATURDAY_16)
    assert schedules.fire(SATURDAY_16) == []  # the same minute never fires twice
    assert schedules.fire(datetime(2026, 12, 5, 16, 1, tzinfo=UTC)) == []
    main = loop.hub.world.repos["acme/sample"].branches["main"]
    scheduled = [runs.get_run(loop.redis, run_id) for run_id in created]
    assert sorted(r.batch for r in scheduled if r) == ["1", "2", "4", "8", "cpu"]
    assert all(r and (r.sha, r.pr, r.trigger) == (main, 0, RunTrigger.SCHEDULE) for r in scheduled)
    loop.process(REPORTS_QUEUE)
    assert {c["status"] for c in loop.checks(main).values()} == {"queued"}
    run_everything(loop)
    finished = [runs.get_run(loop.redis, run_id) for run_id in created]
    assert [r.state for r in finished if r] == [RunState.COMPLETED] * 5
    conclusions = {name: c["conclusion"] for name, c in loop.checks(main).items()}
    assert conclusions == {
        "gpuci / batch cpu": "success",
        "gpuci / batch 1": "success",
        "gpuci / batch 2": "failure",
        "gpuci / batch 4": "neutral",
        "gpuci / batch 8": "failure",
    }
