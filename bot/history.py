"""The test history in Redis: each finished run's per-test outcomes, kept within bounds per
batch and branch, and read back as the default branch's baseline for bot/classify.py."""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any

from redis import Redis

from bot import classify
from bot.classify import BaselineRun, Policy, Since, ThisRun
from bot.runs import RESULT_TTL_S, Run
from contract import keys
from contract.checks import Verdict
from contract.outcomes import FAILING, Outcome, TestOutcome
from contract.results import RunReport
from contract.settings import Settings

log = logging.getLogger("gpuci.history")

# outcomes of this run that are compared with the baseline: failures, skips, XPASSes
_COMPARED = frozenset((Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED, Outcome.XPASSED))
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
    Redis round trips however many tests: read the baseline, write the run."""
    tests = tests_of(report)
    if not tests or report.cancelled or report.error:
        return verdict
    names = [t.test_id for t in tests]
    numbers = test_numbers(names)
    by_number = dict(zip(numbers, tests, strict=True))
    slowest = dict(report.summary.slowest)
    slow = {n: name for n, name in zip(numbers, names, strict=True) if name in slowest}
    wanted = {n for n, t in by_number.items() if t.outcome in _COMPARED}
    baseline, since = read_baseline(
        conn, run.repo, run.batch, policy.flaky_window, wanted, set(slow)
    )
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
    if "history" not in judged.data:
        judged.data["history"] = classify.classification_json(found, label)
    judged.data["history"]["slowest"] = [[label[n], s, m] for n, s, m in medians]
    record(conn, run, report, numbers, tests, since, bounds)
    return judged


def tests_of(report: RunReport) -> list[TestOutcome]:
    """The report's tests, with the failures it names but does not list (collection errors)."""
    tests = [t for t in report.tests if _recordable(t.test_id)]
    listed = {t.test_id for t in tests}
    for failure in report.summary.failures:
        if failure.test_id not in listed and _recordable(failure.test_id):
            kind = Outcome.FAILED if failure.kind == "failure" else Outcome.ERROR
            tests.append(TestOutcome(failure.test_id, kind))
            listed.add(failure.test_id)
    return tests


def _recordable(test_id: str) -> bool:
    """An id the history can keep: one line, not empty."""
    return bool(test_id) and "\n" not in test_id


# --- test numbers -----------------------------------------------------------------------------


def test_number(test_id: str) -> int:
    """A test id's number in the history: 64 bits of its BLAKE2b hash. Records hold numbers,
    never ids, and computing them costs no Redis round trip; at 2^64 a collision between a
    repository's tests is not a practical concern (10^6 ids: about 1 in 3.7 * 10^7)."""
    digest = hashlib.blake2b(test_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def test_numbers(test_ids: Sequence[str]) -> list[int]:
    return [test_number(t) for t in test_ids]


# --- records ------------------------------------------------------------------------------------

_HEAD = struct.Struct("<II")  # the JSON head's length, the number of tests


@dataclass(frozen=True)
class Record:
    """One recorded run: a JSON head (the run, where and in what it ran, sparse columns:
    reruns, skip reasons) and dense columns, one entry per test, in the order it ran."""

    head: dict[str, Any]
    numbers: bytes  # uint64 per test: its number (test_number)
    outcomes: str  # an Outcome letter per test
    ms: bytes  # uint32 per test: milliseconds

    def number_list(self) -> array[int]:
        return _unpacked("Q", self.numbers)

    def seconds(self, i: int) -> float:
        return float(_unpacked("I", self.ms[4 * i : 4 * i + 4])[0]) / 1000


def _unpacked(kind: str, raw: bytes) -> array[int]:
    """A little-endian column: "I" 32-bit, "Q" 64-bit unsigned."""
    values = array(kind)
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _packed(kind: str, values: Sequence[int]) -> bytes:
    column = array(kind, values)
    if sys.byteorder != "little":
        column.byteswap()
    return column.tobytes()


def encode_record(
    run: Run, report: RunReport, numbers: Sequence[int], tests: Sequence[TestOutcome]
) -> bytes:
    """One run as the history keeps it (Record), zlib-packed."""
    reasons = sorted({t.reason for t in tests if t.reason})
    where = {r: i for i, r in enumerate(reasons)}
    head = {
        "run": run.run_id,
        "sha": run.sha,
        "pr": run.pr,
        "batch": run.batch,
        "host": run.host,
        "gpu": report.gpus[0].name if report.gpus else "",
        "runtime": report.runtime,
        "at": time.time(),
        "duration": report.summary.duration_s or report.duration_s,
        "skipped": report.summary.skipped,
        "r": {str(i): t.reruns for i, t in enumerate(tests) if t.reruns},
        "reasons": reasons,
        "k": {str(i): where[t.reason] for i, t in enumerate(tests) if t.reason},
    }
    text = json.dumps(head, separators=(",", ":")).encode()
    ms = _packed("I", [min(int(t.seconds * 1000), 2**32 - 1) for t in tests])
    outcomes = "".join(t.outcome for t in tests).encode()
    body = _HEAD.pack(len(text), len(tests)) + text + _packed("Q", numbers) + outcomes + ms
    return zlib.compress(body, 1)


def decode_record(packed: bytes) -> Record | None:
    """The record, or None for one that is not (a newer or damaged format)."""
    try:
        body = zlib.decompress(packed)
        size, count = _HEAD.unpack_from(body)
        head = json.loads(body[_HEAD.size : _HEAD.size + size])
    except (zlib.error, struct.error, ValueError):
        return None
    at = _HEAD.size + size
    numbers, outcomes, ms = (
        body[at : at + 8 * count],
        body[at + 8 * count : at + 9 * count],
        body[at + 9 * count :],
    )
    if not isinstance(head, dict) or len(ms) != 4 * count:
        return None
    return Record(head, numbers, outcomes.decode("ascii", "replace"), ms)


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


# Pushes the run, trims its lists to the bound and deletes the records that fall off; on the
# default branch, failing tests start a streak (ARGV[7]: "number<TAB>JSON" lines) and passing
# ones end theirs (ARGV[8]: numbers, comma-separated).
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
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
end
for line in string.gmatch(ARGV[7], "[^\\n]+") do
  local tab = string.find(line, "\\t", 1, true)
  redis.call('HSET', KEYS[4], string.sub(line, 1, tab - 1), string.sub(line, tab + 1))
end
for number in string.gmatch(ARGV[8], "[^,]+") do
  redis.call('HDEL', KEYS[4], number)
end
"""


def record(
    conn: Redis,
    run: Run,
    report: RunReport,
    numbers: Sequence[int],
    tests: Sequence[TestOutcome],
    since: dict[int, Since],
    bounds: Bounds,
) -> None:
    """Store the run within its branch's bound; a default-branch run also moves the failing
    streaks. One Lua call: one round trip."""
    branch = branch_of(run)
    default = branch == DEFAULT
    started, ended = _moved_streaks(run, numbers, tests, since) if default else ("", "")
    conn.register_script(_RECORD)(
        keys=[
            keys.history_runs(run.repo, run.batch, branch),
            keys.history_trend(run.repo, run.batch, branch),
            keys.history_record(run.repo, run.run_id),
            keys.history_failing(run.repo, run.batch),
        ],
        args=[
            encode_record(run, report, numbers, tests),
            run.run_id,
            trend_entry(run, report),
            max(bounds.default_runs if default else bounds.pr_runs, 1),
            keys.history_record_prefix(run.repo),
            0 if default else bounds.pr_ttl_s,
            started,
            ended,
        ],
    )


def _moved_streaks(
    run: Run, numbers: Sequence[int], tests: Sequence[TestOutcome], since: dict[int, Since]
) -> tuple[str, str]:
    """Failing tests not yet in a streak start one here; passing tests end theirs."""
    now = time.time()
    started = [
        f"{n}\t{json.dumps({'sha': run.sha, 'at': now, 'id': t.test_id})}"
        for n, t in zip(numbers, tests, strict=True)
        if t.outcome in FAILING and n not in since
    ]
    ended = [
        str(n)
        for n, t in zip(numbers, tests, strict=True)
        if t.outcome in classify.PASSING and n in since
    ]
    return "\n".join(started), ",".join(ended)


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
    wanted: Set[int] = frozenset(),
    timed: Set[int] = frozenset(),
) -> tuple[list[BaselineRun[int]], dict[int, Since]]:
    """The batch's last `limit` default-branch runs, newest first, with the outcomes of the
    `wanted` tests and the seconds of the `timed` ones, and its failing streaks (one Lua
    call). Decoding only what classification asks keeps it fast at 10,000 tests a run."""
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
    layouts: dict[bytes, dict[int, int]] = {}
    records = (decode_record(p) for p in packed if p)
    runs = [_baseline_run(record, wanted, timed, layouts) for record in records if record]
    return runs, since


def _baseline_run(
    record: Record, wanted: Set[int], timed: Set[int], layouts: dict[bytes, dict[int, int]]
) -> BaselineRun[int]:
    """The record's outcomes of the `wanted` tests; runs with the same tests in the same order
    (most of them) share one index of where each test is."""
    index = layouts.get(record.numbers)
    if index is None:
        index = layouts[record.numbers] = {n: i for i, n in enumerate(record.number_list())}
    outcomes = record.outcomes
    return BaselineRun(
        sha=str(record.head["sha"]),
        at=float(record.head["at"]),
        outcomes={n: outcomes[index[n]] for n in wanted if n in index},
        skipped=int(record.head.get("skipped", 0)),
        seconds={n: record.seconds(index[n]) for n in timed if n in index},
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
    number = test_number(test_id)
    ids = conn.lrange(keys.history_runs(repo, batch, DEFAULT), 0, limit - 1)
    packed = conn.mget([keys.history_record(repo, _text(i)) for i in ids]) if ids else []
    out = []
    for raw in packed:
        record = decode_record(raw) if isinstance(raw, bytes) else None
        if record is not None:
            out.append(_test_entry(record, number))
    return out


def _test_entry(record: Record, number: int | None) -> dict[str, Any]:
    head = record.head
    entry = {k: head.get(k) for k in ("run", "sha", "at", "host", "gpu")}
    try:
        i = record.number_list().index(number)  # type: ignore[arg-type]
    except ValueError:
        return {**entry, "outcome": "-", "seconds": None, "reruns": 0, "reason": ""}
    reason = head["reasons"][head["k"][str(i)]] if str(i) in head["k"] else ""
    return {
        **entry,
        "outcome": record.outcomes[i],
        "seconds": record.seconds(i),
        "reruns": head["r"].get(str(i), 0),
        "reason": reason,
    }


def run_count(conn: Redis, repo: str, batch: str, branch: str = DEFAULT) -> int:
    return int(conn.llen(keys.history_runs(repo, batch, branch)))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def failing_now(conn: Redis, repo: str, batch: str) -> list[dict[str, Any]]:
    """Tests failing on the default branch, each with the commit and time its streak began,
    oldest streak first."""
    raw = conn.hgetall(keys.history_failing(repo, batch))
    found = []
    for value in raw.values():
        entry = json.loads(value)
        found.append({"test_id": entry.get("id", ""), "sha": entry["sha"], "at": entry["at"]})
    return sorted(found, key=lambda e: (e["at"], e["test_id"]))


def batch_summary(conn: Redis, repo: str, batch: str) -> dict[str, Any]:
    """What `gpuci history REPO BATCH` and the batch's page show: its default-branch runs
    (oldest first) and the tests failing there now."""
    runs = list(reversed(trend(conn, repo, batch)))
    durations = [float(r["duration"]) for r in runs]
    return {
        "repo": repo,
        "batch": batch,
        "runs": runs,
        "median_duration_s": statistics.median(durations) if durations else None,
        "failing": failing_now(conn, repo, batch),
    }


def test_summary(conn: Redis, repo: str, batch: str, test_id: str) -> dict[str, Any]:
    """What `gpuci history REPO BATCH TEST` and the test's page show: its outcome in each of
    the batch's last default-branch runs, oldest first."""
    runs = list(reversed(test_history(conn, repo, batch, test_id)))
    return {"repo": repo, "batch": batch, "test_id": test_id, "runs": runs}
