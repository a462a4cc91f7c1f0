"""The test history in Redis: each finished run's per-test outcomes, kept within bounds per
batch and branch, and read back as the default branch's baseline for bot/classify.py."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import operator
import statistics
import struct
import sys
import time
from array import array
from collections.abc import Sequence, Set
from dataclasses import dataclass, replace
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
    Redis round trips however many tests: read the baseline, its slowest tests' seconds, and
    write the run."""
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
        conn, run.repo, run.batch, policy.flaky_window, wanted, set(slow), exclude=run.run_id
    )
    found = classify.classify(this_run(by_number, report), baseline, since, policy)
    label = dict(zip(numbers, names, strict=True))
    judged = classify.against_history(verdict, report, found, label, batch=run.batch, mode=mode)
    medians = classify.slow_medians([(n, slowest[name]) for n, name in slow.items()], baseline)
    if "history" not in judged.data:
        judged.data["history"] = classify.classification_json(found, label)
    judged.data["history"]["slowest"] = [[label[n], s, m] for n, s, m in medians]
    record(conn, run, report, numbers, tests, since, bounds)
    return judged


def this_run(by_number: dict[int, TestOutcome], report: RunReport) -> ThisRun[int]:
    """The run as the classifier takes it, its tests by number."""
    return ThisRun(
        failed=[n for n, t in by_number.items() if t.outcome in FAILING],
        outcomes={n: t.outcome for n, t in by_number.items()},
        reruns={n: t.reruns for n, t in by_number.items() if t.reruns},
        reasons={n: t.reason for n, t in by_number.items() if t.reason},
        skipped=report.summary.skipped,
    )


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


@functools.lru_cache(maxsize=200_000)
def test_number(test_id: str) -> int:
    """A test id's number in the history: 64 bits of its BLAKE2b hash. Records hold numbers,
    never ids, and computing them costs no Redis round trip; at 2^64 a collision between a
    repository's tests is not a practical concern (10^6 ids: about 1 in 3.7 * 10^7). Cached:
    the same tests come back run after run."""
    digest = hashlib.blake2b(test_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def test_numbers(test_ids: Sequence[str]) -> list[int]:
    return [test_number(t) for t in test_ids]


# --- records ------------------------------------------------------------------------------------
# A record is [head length, test count] (two uint32), the JSON head, one outcome letter per
# test, then one float32 of seconds per test. The tests' numbers (uint64 each, 80 KB for 10,000
# tests) are the record's *layout*, stored once for every record that lists the same tests in
# the same order (most of a batch's runs): the baseline read moves 10 KB a run, not 130 KB. A
# layout is kept while a default-branch record uses it, a PR's only for the PR's 30 days.

_HEAD = struct.Struct("<II")


@dataclass(frozen=True)
class Record:
    """One recorded run: its head (the run, where and in what it ran, sparse columns: reruns,
    skip reasons, its layout) and its outcomes, one letter per test in the order it ran."""

    head: dict[str, Any]
    outcomes: str
    seconds: bytes = b""  # float32 per test; empty when not read

    @property
    def layout(self) -> str:
        return str(self.head.get("layout", ""))

    def seconds_of(self, i: int) -> float:
        return float(_unpacked("f", self.seconds[4 * i : 4 * i + 4])[0])


def _unpacked(kind: str, raw: bytes) -> array[Any]:
    """A little-endian column: "f" float32, "Q" uint64."""
    values = array(kind)
    values.frombytes(raw[: len(raw) - len(raw) % values.itemsize])
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _packed(kind: str, values: Sequence[Any]) -> bytes:
    column = array(kind, values)
    if sys.byteorder != "little":
        column.byteswap()
    return column.tobytes()


def layout_of(numbers: Sequence[int]) -> tuple[str, bytes]:
    """The numbers column of a run, and the name it is stored under (a hash of it)."""
    column = _packed("Q", numbers)
    return hashlib.blake2b(column, digest_size=16).hexdigest(), column


def encode_record(run: Run, report: RunReport, layout: str, tests: Sequence[TestOutcome]) -> bytes:
    """One run as the history keeps it (Record). Not compressed: reading 20 records back is
    the classification's main cost, and outcome letters are already one byte a test."""
    reasons = sorted({t.reason for t in tests if t.reason})
    where = {r: i for i, r in enumerate(reasons)}
    reruns, skips = {}, {}
    for i, t in enumerate(tests):
        if t.reruns:
            reruns[str(i)] = t.reruns
        if t.reason:
            skips[str(i)] = where[t.reason]
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
        "layout": layout,
        "r": reruns,
        "reasons": reasons,
        "k": skips,
    }
    text = json.dumps(head, separators=(",", ":")).encode()
    outcomes = "".join(t.outcome for t in tests).encode()
    seconds = _packed("f", [t.seconds for t in tests])
    return _HEAD.pack(len(text), len(tests)) + text + outcomes + seconds


def decode_record(packed: bytes) -> Record | None:
    """The record (its seconds if `packed` has them), or None for one that is not."""
    try:
        size, count = _HEAD.unpack_from(packed)
        head = json.loads(packed[_HEAD.size : _HEAD.size + size])
    except (struct.error, ValueError):
        return None
    at = _HEAD.size + size
    outcomes = packed[at : at + count]
    if not isinstance(head, dict) or len(outcomes) != count:
        return None
    return Record(head, outcomes.decode("ascii", "replace"), packed[at + count :])


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
# ones end theirs (ARGV[8]: numbers, comma-separated). A layout lives while a default-branch
# record uses it (KEYS[6] counts them), else for a PR's time (ARGV[10] seconds from last use).
_RECORD = """
local default = ARGV[12] == '1'
local function release(key)
  local top = redis.call('GETRANGE', key, 0, 7)
  if #top ~= 8 then return end
  local size = struct.unpack('<I4', top)
  local ok, head = pcall(cjson.decode, redis.call('GETRANGE', key, 8, 8 + size - 1))
  local layout = ok and type(head) == 'table' and head['layout']
  if type(layout) == 'string' and redis.call('HINCRBY', KEYS[6], layout, -1) <= 0 then
    redis.call('HDEL', KEYS[6], layout)
    redis.call('DEL', ARGV[11] .. layout)
  end
end
if default then release(KEYS[3]) end
redis.call('SET', KEYS[3], ARGV[1])
redis.call('SET', KEYS[5], ARGV[9])
if default then redis.call('HINCRBY', KEYS[6], ARGV[13], 1) end
if tonumber(redis.call('HGET', KEYS[6], ARGV[13]) or '0') > 0 then
  redis.call('PERSIST', KEYS[5])
else
  redis.call('EXPIRE', KEYS[5], tonumber(ARGV[10]))
end
redis.call('LREM', KEYS[1], 0, ARGV[2])
redis.call('LPUSH', KEYS[1], ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[3])
local bound = tonumber(ARGV[4])
for _, old in ipairs(redis.call('LRANGE', KEYS[1], bound, -1)) do
  if old ~= ARGV[2] then
    if default then release(ARGV[5] .. old) end
    redis.call('DEL', ARGV[5] .. old)
  end
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
    layout, column = layout_of(numbers)
    conn.register_script(_RECORD)(
        keys=[
            keys.history_runs(run.repo, run.batch, branch),
            keys.history_trend(run.repo, run.batch, branch),
            keys.history_record(run.repo, run.run_id),
            keys.history_failing(run.repo, run.batch),
            keys.history_layout(run.repo, layout),
            keys.history_layout_uses(run.repo),
        ],
        args=[
            encode_record(run, report, layout, tests),
            run.run_id,
            trend_entry(run, report),
            max(bounds.default_runs if default else bounds.pr_runs, 1),
            keys.history_record_prefix(run.repo),
            0 if default else bounds.pr_ttl_s,
            started,
            ended,
            column,
            bounds.pr_ttl_s,
            keys.history_layout(run.repo, ""),
            "1" if default else "0",
            layout,
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

# The batch's last ARGV[1] default-branch records without their seconds, each layout they use
# once, and the failing streaks.
_BASELINE = """
local ids = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local records, layouts, seen = {}, {}, {}
for _, id in ipairs(ids) do
  local key = ARGV[2] .. id
  local top = redis.call('GETRANGE', key, 0, 7)
  if #top == 8 then
    local size, count = struct.unpack('<I4<I4', top)
    local part = redis.call('GETRANGE', key, 0, 8 + size + count - 1)
    records[#records + 1] = id
    records[#records + 1] = part
    local ok, head = pcall(cjson.decode, string.sub(part, 9, 8 + size))
    local layout = ok and type(head) == 'table' and head['layout']
    if type(layout) == 'string' and not seen[layout] then
      seen[layout] = true
      layouts[#layouts + 1] = layout
      layouts[#layouts + 1] = redis.call('GET', ARGV[3] .. layout) or ''
    end
  end
end
return {redis.call('HGETALL', KEYS[2]), records, layouts}
"""

# The seconds at some places of some records: ARGV[1] the record prefix, then pairs of a run
# id and its places, comma-separated; one list of float32 strings per pair.
_SECONDS = """
local out = {}
for i = 2, #ARGV, 2 do
  local key = ARGV[1] .. ARGV[i]
  local top = redis.call('GETRANGE', key, 0, 7)
  local found = {}
  if #top == 8 then
    local size, count = struct.unpack('<I4<I4', top)
    local start = 8 + size + count
    for place in string.gmatch(ARGV[i + 1], "[^,]+") do
      local at = start + 4 * tonumber(place)
      found[#found + 1] = redis.call('GETRANGE', key, at, at + 3)
    end
  end
  out[#out + 1] = found
end
return out
"""


@dataclass(frozen=True)
class _Layout:
    """Where some tests are in the records of one layout: found once per layout, then each
    record of it is read with one C-level call."""

    present: list[int]  # the tests this layout has
    places: list[int]  # their places in its records' columns

    @classmethod
    def of(cls, numbers: array[Any], tests: Set[int]) -> _Layout:
        index = {n: i for i, n in enumerate(numbers) if n in tests}
        return cls(list(index), list(index.values()))

    def pick(self, column: Sequence[Any]) -> list[Any]:
        if not self.places:
            return []
        picked = operator.itemgetter(*self.places)(column)
        return list(picked) if len(self.places) > 1 else [picked]


def read_baseline(
    conn: Redis,
    repo: str,
    batch: str,
    limit: int,
    wanted: Set[int] = frozenset(),
    timed: Set[int] = frozenset(),
    *,
    exclude: str = "",
) -> tuple[list[BaselineRun[int]], dict[int, Since]]:
    """The batch's last `limit` default-branch runs, newest first, with the outcomes of the
    `wanted` tests and the seconds of the `timed` ones, and its failing streaks: one Lua call,
    and one more for seconds. Only what classification asks is moved and decoded, which keeps
    it fast at 10,000 tests a run. A record whose layout expired is left out, and so is the
    run `exclude` (the one being judged: a message applied twice must not meet itself)."""
    found: Any = conn.register_script(_BASELINE)(
        keys=[keys.history_runs(repo, batch, DEFAULT), keys.history_failing(repo, batch)],
        args=[max(limit, 1) + 1, keys.history_record_prefix(repo), keys.history_layout(repo, "")],
    )
    streaks, flat_records, flat_layouts = found
    since = {}
    for number, raw in zip(streaks[::2], streaks[1::2], strict=True):
        try:
            entry = json.loads(raw)
            since[int(number)] = Since(str(entry["sha"]), float(entry["at"]))
        except (ValueError, KeyError, TypeError):
            log.warning("history of %s batch %s: unreadable streak %r dropped", repo, batch, raw)
    columns = {
        _text(name): _unpacked("Q", column)
        for name, column in zip(flat_layouts[::2], flat_layouts[1::2], strict=True)
    }
    places: dict[str, tuple[_Layout, _Layout]] = {}
    runs: list[BaselineRun[int]] = []
    timed_places: list[tuple[str, _Layout]] = []
    for run_id, raw in zip(flat_records[::2], flat_records[1::2], strict=True):
        rec = decode_record(raw)
        if rec is None or rec.layout not in columns or _text(run_id) == exclude:
            continue
        if len(runs) == max(limit, 1):
            break
        if rec.layout not in places:
            numbers = columns[rec.layout]
            places[rec.layout] = (_Layout.of(numbers, wanted), _Layout.of(numbers, timed))
        outcomes, times = places[rec.layout]
        runs.append(
            BaselineRun(
                sha=str(rec.head["sha"]),
                at=float(rec.head["at"]),
                outcomes=dict(zip(outcomes.present, outcomes.pick(rec.outcomes), strict=True)),
                skipped=int(rec.head.get("skipped", 0)),
            )
        )
        timed_places.append((_text(run_id), times))
    if timed and runs:
        runs = _with_seconds(conn, repo, runs, timed_places)
    return runs, since


def _with_seconds(
    conn: Redis, repo: str, runs: list[BaselineRun[int]], where: list[tuple[str, _Layout]]
) -> list[BaselineRun[int]]:
    args: list[Any] = [keys.history_record_prefix(repo)]
    for run_id, layout in where:
        args += [run_id, ",".join(map(str, layout.places)) or "-1"]
    found: Any = conn.register_script(_SECONDS)(keys=[], args=args)
    out = []
    for run, (_, layout), values in zip(runs, where, found, strict=True):
        seconds = [float(_unpacked("f", v)[0]) for v in values if len(v) == 4]
        if len(seconds) != len(layout.present):
            seconds = []
        out.append(replace(run, seconds=dict(zip(layout.present, seconds, strict=False))))
    return out


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
    records = [r for raw in packed if isinstance(raw, bytes) and (r := decode_record(raw))]
    names = sorted({r.layout for r in records})
    found = conn.mget([keys.history_layout(repo, name) for name in names]) if names else []
    places = {
        name: {n: i for i, n in enumerate(_unpacked("Q", column))}.get(number)
        for name, column in zip(names, found, strict=True)
        if isinstance(column, bytes)
    }
    return [_test_entry(r, places.get(r.layout)) for r in records if r.layout in places]


def _test_entry(record: Record, i: int | None) -> dict[str, Any]:
    head = record.head
    entry = {k: head.get(k) for k in ("run", "sha", "at", "host", "gpu")}
    if i is None:
        return {**entry, "outcome": "-", "seconds": None, "reruns": 0, "reason": ""}
    reason = head["reasons"][head["k"][str(i)]] if str(i) in head["k"] else ""
    return {
        **entry,
        "outcome": record.outcomes[i],
        "seconds": round(record.seconds_of(i), 3),
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
