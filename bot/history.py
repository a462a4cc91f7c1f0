"""The test history in Redis: each finished run's per-test outcomes, kept within bounds per
batch and branch, and read back as the default branch's baseline for bot/classify.py."""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from bot import classify
from bot.classify import BaselineRun, Classification, Policy, Since, ThisRun
from bot.runs import RESULT_TTL_S, Run
from contract import keys
from contract.checks import Verdict
from contract.outcomes import FAILING, Outcome, TestOutcome
from contract.results import RunReport
from contract.settings import Settings

log = logging.getLogger("gpuci.history")

DEFAULT = "default"  # the branch name of default-branch runs in keys (PRs: "pr:N")
STRIP_RUNS = 50  # runs a test's page and `gpuci history ... TEST` show


@dataclass(frozen=True)
class Bounds:
    """How many runs are kept per batch: on the default branch, and per PR (which expire)."""

    default_runs: int = 200
    pr_runs: int = 20
    pr_ttl_s: int = RESULT_TTL_S


def from_settings(settings: Settings) -> tuple[Policy, Bounds]:
    policy = Policy(
        flaky_flips=settings.history_flaky_flips,
        flaky_window=settings.history_flaky_window,
        xpass_runs=settings.history_xpass_runs,
    )
    return policy, Bounds(settings.history_default_runs, settings.history_pr_runs)


def branch_of(run: Run) -> str:
    return DEFAULT if run.pr == 0 else f"pr:{run.pr}"


# --- the one call of the report path ------------------------------------------------------------


def judge_with_history(
    conn: Redis,
    run: Run,
    report: RunReport,
    verdict: Verdict,
    *,
    mode: str,
    policy: Policy,
    bounds: Bounds,
) -> Verdict:
    """The verdict against the batch's baseline, and the run recorded into the history. Three
    Redis round trips however many tests: intern the ids, read the baseline, write."""
    tests = tests_of(report)
    if not tests or report.cancelled or report.error:
        return verdict
    names = [t.test_id for t in tests]
    numbers = intern(conn, run.repo, names)
    by_number = dict(zip(numbers, tests, strict=True))
    slowest = dict(report.summary.slowest)
    slow = {n: name for n, name in zip(numbers, names, strict=True) if name in slowest}
    baseline, since = read_baseline(conn, run.repo, run.batch, policy.flaky_window, set(slow))
    this = ThisRun(
        failed=[n for n, t in by_number.items() if t.outcome in FAILING],
        outcomes={n: t.outcome for n, t in by_number.items()},
        reruns={n: t.reruns for n, t in by_number.items() if t.reruns},
        reasons={n: t.reason for n, t in by_number.items() if t.reason},
        skipped=report.summary.skipped,
    )
    found = classify.classify(this, baseline, since, policy)
    label = dict(zip(numbers, names, strict=True))
    judged = classify.against_history(verdict, report, found, label, batch=run.batch, mode=mode)
    medians = classify.slow_medians([(n, slowest[name]) for n, name in slow.items()], baseline)
    judged.data.setdefault("history", classify.classification_json(found, label))
    judged.data["history"]["slowest"] = [[label[n], s, m] for n, s, m in medians]
    record(conn, run, report, numbers, tests, found, since, bounds)
    return judged


def tests_of(report: RunReport) -> list[TestOutcome]:
    """The report's tests, with the failures it names but does not list (collection errors)."""
    tests = list(report.tests)
    listed = {t.test_id for t in tests}
    for failure in report.summary.failures:
        if failure.test_id not in listed:
            kind = Outcome.FAILED if failure.kind == "failure" else Outcome.ERROR
            tests.append(TestOutcome(failure.test_id, kind))
            listed.add(failure.test_id)
    return tests


# --- interning test ids -----------------------------------------------------------------------

_INTERN = """
local out = {}
for i, name in ipairs(ARGV) do
  local n = redis.call('HGET', KEYS[1], name)
  if not n then
    n = redis.call('INCR', KEYS[3])
    redis.call('HSET', KEYS[1], name, n)
    redis.call('HSET', KEYS[2], n, name)
  end
  out[i] = tonumber(n)
end
return out
"""


def intern(conn: Redis, repo: str, test_ids: Sequence[str]) -> list[int]:
    """Each test id's number in the repository's history, new ones numbered (one Lua call)."""
    script = conn.register_script(_INTERN)
    names = (keys.history_test_numbers(repo), keys.history_test_names(repo))
    found = script(keys=[*names, keys.history_counter(repo)], args=list(test_ids))
    return [int(n) for n in found]


def test_number(conn: Redis, repo: str, test_id: str) -> int | None:
    found = conn.hget(keys.history_test_numbers(repo), test_id)
    return None if found is None else int(found)


# --- records ------------------------------------------------------------------------------------


def encode_record(
    run: Run, report: RunReport, numbers: Sequence[int], tests: Sequence[TestOutcome]
) -> bytes:
    """One run as the history keeps it: metadata, then a column per field, zlib-packed."""
    reasons = sorted({t.reason for t in tests if t.reason})
    where = {r: i for i, r in enumerate(reasons)}
    gpu = report.gpus[0].name if report.gpus else ""
    data = {
        "run": run.run_id,
        "sha": run.sha,
        "pr": run.pr,
        "batch": run.batch,
        "host": run.host,
        "gpu": gpu,
        "runtime": report.runtime,
        "at": time.time(),
        "duration": report.summary.duration_s or report.duration_s,
        "skipped": report.summary.skipped,
        "n": list(numbers),
        "o": "".join(t.outcome for t in tests),
        "ms": [round(t.seconds * 1000) for t in tests],
        "r": {str(i): t.reruns for i, t in enumerate(tests) if t.reruns},
        "reasons": reasons,
        "k": {str(i): where[t.reason] for i, t in enumerate(tests) if t.reason},
    }
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 1)


def decode_record(packed: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(zlib.decompress(packed))
    except (zlib.error, ValueError):
        return None
    return data if isinstance(data, dict) else None


def trend_entry(run: Run, report: RunReport) -> str:
    s = report.summary
    return json.dumps(
        {
            "run": run.run_id,
            "sha": run.sha,
            "at": time.time(),
            "duration": s.duration_s or report.duration_s,
            "tests": s.tests,
            "passed": s.passed,
            "failed": s.failed,
            "errors": s.errors,
            "skipped": s.skipped,
        }
    )


# Pushes the run, trims its lists to the bound and deletes the records that fall off.
_RECORD = """
redis.call('SET', KEYS[3], ARGV[1])
redis.call('LREM', KEYS[1], 0, ARGV[2])
redis.call('LPUSH', KEYS[1], ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[3])
local bound = tonumber(ARGV[4])
for _, old in ipairs(redis.call('LRANGE', KEYS[1], bound, -1)) do
  if old ~= ARGV[2] then redis.call('DEL', ARGV[5] .. old) end
end
redis.call('LTRIM', KEYS[1], 0, bound - 1)
redis.call('LTRIM', KEYS[2], 0, bound - 1)
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, ttl) end
end
"""


def record(
    conn: Redis,
    run: Run,
    report: RunReport,
    numbers: Sequence[int],
    tests: Sequence[TestOutcome],
    found: Classification[int],
    since: dict[int, Since],
    bounds: Bounds,
) -> None:
    """Store the run within its branch's bound; a default-branch run also moves the failing
    streaks (one pipelined round trip)."""
    branch = branch_of(run)
    default = branch == DEFAULT
    bound = bounds.default_runs if default else bounds.pr_runs
    script = conn.register_script(_RECORD)
    pipe = conn.pipeline(transaction=True)
    script(
        keys=[
            keys.history_runs(run.repo, run.batch, branch),
            keys.history_trend(run.repo, run.batch, branch),
            keys.history_record(run.repo, run.run_id),
        ],
        args=[
            encode_record(run, report, numbers, tests),
            run.run_id,
            trend_entry(run, report),
            max(bound, 1),
            keys.history_record_prefix(run.repo),
            0 if default else bounds.pr_ttl_s,
        ],
        client=pipe,
    )
    if default:
        _move_streaks(pipe, run, numbers, tests, since)
    pipe.execute()


def _move_streaks(
    pipe: Any,
    run: Run,
    numbers: Sequence[int],
    tests: Sequence[TestOutcome],
    since: dict[int, Since],
) -> None:
    """Failing tests not yet in the streaks start one here; passing tests end theirs."""
    key = keys.history_failing(run.repo, run.batch)
    now = time.time()
    started = {
        n: json.dumps({"sha": run.sha, "at": now})
        for n, t in zip(numbers, tests, strict=True)
        if t.outcome in FAILING and n not in since
    }
    ended = [
        n
        for n, t in zip(numbers, tests, strict=True)
        if t.outcome in classify.PASSING and n in since
    ]
    if started:
        pipe.hset(key, mapping=started)
    if ended:
        pipe.hdel(key, *ended)


# --- reading the baseline -----------------------------------------------------------------------

_BASELINE = """
local ids = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local out = {redis.call('HGETALL', KEYS[2])}
for _, id in ipairs(ids) do
  out[#out + 1] = redis.call('GET', ARGV[2] .. id) or ''
end
return out
"""


def read_baseline(
    conn: Redis,
    repo: str,
    batch: str,
    limit: int,
    timed: set[int] = frozenset(),  # type: ignore[assignment]
) -> tuple[list[BaselineRun[int]], dict[int, Since]]:
    """The batch's last `limit` default-branch runs, newest first, and its failing streaks
    (one Lua call); seconds only of the tests in `timed`."""
    script = conn.register_script(_BASELINE)
    found: Any = script(
        keys=[keys.history_runs(repo, batch, DEFAULT), keys.history_failing(repo, batch)],
        args=[max(limit, 1), keys.history_record_prefix(repo)],
    )
    streaks, packed = found[0], found[1:]
    since = {}
    for number, raw in zip(streaks[::2], streaks[1::2], strict=True):
        entry = json.loads(raw)
        since[int(number)] = Since(str(entry["sha"]), float(entry["at"]))
    runs = [_baseline_run(data, timed) for p in packed if p and (data := decode_record(p))]
    return runs, since


def _baseline_run(data: dict[str, Any], timed: set[int]) -> BaselineRun[int]:
    numbers, outcomes = data["n"], data["o"]
    seconds = {}
    if timed:
        ms = data["ms"]
        seconds = {n: ms[i] / 1000 for i, n in enumerate(numbers) if n in timed}
    return BaselineRun(
        sha=str(data["sha"]),
        at=float(data["at"]),
        outcomes=dict(zip(numbers, outcomes, strict=True)),
        skipped=int(data.get("skipped", 0)),
        seconds=seconds,
    )


# --- reading for people: the dashboard and `gpuci history` -------------------------------------


def trend(conn: Redis, repo: str, batch: str, branch: str = DEFAULT) -> list[dict[str, Any]]:
    """The batch's recorded runs on `branch`, newest first: sha, time, duration, counts."""
    raw = conn.lrange(keys.history_trend(repo, batch, branch), 0, -1)
    return [json.loads(entry) for entry in raw]


def test_history(
    conn: Redis, repo: str, batch: str, test_id: str, limit: int = STRIP_RUNS
) -> list[dict[str, Any]]:
    """One test's outcome in the batch's last `limit` default-branch runs, newest first
    ("-": the run did not have it)."""
    number = test_number(conn, repo, test_id)
    ids = conn.lrange(keys.history_runs(repo, batch, DEFAULT), 0, limit - 1)
    packed = conn.mget([keys.history_record(repo, _text(i)) for i in ids]) if ids else []
    out = []
    for raw in packed:
        data = decode_record(raw) if isinstance(raw, bytes) else None
        if data is None:
            continue
        out.append(_test_entry(data, number))
    return out


def _test_entry(data: dict[str, Any], number: int | None) -> dict[str, Any]:
    entry = {k: data.get(k) for k in ("run", "sha", "at", "host", "gpu")}
    try:
        i = data["n"].index(number)
    except ValueError:
        return {**entry, "outcome": "-", "seconds": None, "reruns": 0, "reason": ""}
    reason = data["reasons"][data["k"][str(i)]] if str(i) in data["k"] else ""
    reruns = data["r"].get(str(i), 0)
    return {
        **entry,
        "outcome": data["o"][i],
        "seconds": data["ms"][i] / 1000,
        "reruns": reruns,
        "reason": reason,
    }


def run_count(conn: Redis, repo: str, batch: str, branch: str = DEFAULT) -> int:
    return int(conn.llen(keys.history_runs(repo, batch, branch)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
