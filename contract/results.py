"""What a run produces, as both sides see it: the GPUs it ran on and the counts, skip reasons,
XPASSes and failures of its tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.outcomes import TestOutcome, from_columns, to_columns


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mb: int | None = None
    name: str = ""


@dataclass(frozen=True)
class GpuInfo:
    """One sample of one GPU. `error` set means the sample is unusable (and the GPU not idle)."""

    index: int
    uuid: str = ""
    name: str = ""
    memory_total_mb: int | None = None
    memory_used_mb: int | None = None
    utilization_pct: int | None = None
    compute_capability: str = ""  # "9.0"
    driver_version: str = ""
    cuda_version: str = ""  # "12.4"
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None
    minor_number: int | None = None  # its device node is /dev/nvidia<minor>; None: unknown

    @property
    def bf16(self) -> bool:
        major = self.compute_capability.split(".")[0]
        return major.isdigit() and int(major) >= 8


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
    """A batch's results, counted as pytest's terminal summary line counts them."""

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
    failures_dropped: int = 0  # failures beyond max_failures_kept, counted but not kept
    # subtests (unittest's subTest, pytest's `subtests` fixture): pytest counts a failed one
    # in `failed` and a skipped one in `skipped` (or `xfailed`), a passed one on its own
    subtests_passed: int = 0
    subtests_failed: int = 0
    subtests_skipped: int = 0
    running: list[str] = field(default_factory=list)  # started, not finished: a stopped run's


def repo_path(file: str | None, classname: str = "") -> str | None:
    """`file` as a path inside the repository, or None where it cannot be one: a `file://`
    URL or an absolute path is made relative where the test's module names its tail
    (`/home/ci/src/tests/test_x.py` of `tests.test_x` -> `tests/test_x.py`), else dropped, so
    that no annotation or link points outside the repository."""
    if not file:
        return None
    path = file.replace("\\", "/")
    if path.startswith("file:"):
        path = "/" + path.removeprefix("file:").lstrip("/")
    if ":" in path:  # another scheme, or a drive letter
        return _module_tail(path.split(":", 1)[1], classname)
    if path.startswith("/"):
        return _module_tail(path, classname)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return None if not parts or ".." in parts else "/".join(parts)


def _module_tail(path: str, classname: str) -> str | None:
    modules = classname.split(".") if classname else []
    for length in range(len(modules), 0, -1):
        tail = "/".join(modules[:length]) + ".py"
        if path.endswith("/" + tail):
            return tail
    return None


def count_line(summary: Summary) -> str:
    """pytest's summary line: "3 failed, 5 passed, 2 skipped, 1 xfailed, 2 errors, 1 rerun"
    (and "21194 subtests passed", as pytest says it at any verbosity but the default)."""
    parts = [
        ("failed", summary.failed),
        ("passed", summary.passed),
        ("skipped", summary.skipped),
        ("xfailed", summary.xfailed),
        ("xpassed", summary.xpassed),
        ("error" if summary.errors == 1 else "errors", summary.errors),
        ("rerun", summary.reruns),
        ("subtests passed", summary.subtests_passed),
    ]
    return ", ".join(f"{n} {word}" for word, n in parts if n) or "no tests ran"


# --- a finished run's report, as JSON between the host and the bot -------------------------------

MAX_COUNT = 10**9
MAX_FAILURES = 1000
MAX_FIELD = 64 * 1024  # a failure's text, the log tail
MAX_SHORT = 4000  # names, messages, reasons
MAX_GPUS = 64
_COUNTS = (
    "tests", "passed", "failed", "errors", "skipped", "xfailed", "xpassed", "reruns",
    "subtests_passed", "subtests_failed", "subtests_skipped",
)  # fmt: skip
# each outcome's count is at most the tests plus the subtests pytest counts under it
_OUTCOMES = {
    "passed": (), "xpassed": (), "failed": ("subtests_failed",),
    "skipped": ("subtests_skipped",), "xfailed": ("subtests_skipped",),
}  # fmt: skip
MAX_RUNNING = 100


class ResultError(ValueError):
    """A run report that is not well-formed; the message says which field."""


@dataclass
class RunReport:
    """How a run ended, as its host reports it: the counts and failures of its tests, whether
    it timed out, was cancelled or could not run (`error`), and where and in what it ran."""

    summary: Summary
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None
    stopped: str | None = None  # why the host stopped it (its GPU leases were lost)
    gpus: list[GpuInfo] = field(default_factory=list)
    runtime: dict[str, str] = field(default_factory=dict)
    log_tail: str = ""
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    tests: list[TestOutcome] = field(default_factory=list)  # each test's outcome (history)

    def to_json(self) -> dict[str, object]:
        s = self.summary
        return {
            "summary": {
                **{name: getattr(s, name) for name in _COUNTS},
                "failures_dropped": s.failures_dropped,
                "xpassed_tests": list(s.xpassed_tests),
                "skip_reasons": dict(s.skip_reasons),
                "duration_s": s.duration_s,
                "slowest": [list(pair) for pair in s.slowest],
                "failures": [f.__dict__ for f in s.failures],
                "running": list(s.running),
            },
            "timed_out": self.timed_out,
            "cancelled": self.cancelled,
            "error": self.error,
            "stopped": self.stopped,
            "gpus": [
                {**g.__dict__, "processes": [p.__dict__ for p in g.processes]} for g in self.gpus
            ],
            "runtime": dict(self.runtime),
            "log_tail": self.log_tail,
            "notes": list(self.notes),
            "duration_s": self.duration_s,
            "tests": to_columns(self.tests),
        }

    @classmethod
    def from_json(cls, data: object) -> RunReport:
        """The report in `data`, every field checked for type and size (ResultError)."""
        d = _mapping(data, "report")
        return cls(
            summary=_summary(_mapping(d.get("summary"), "summary")),
            timed_out=_flag(d.get("timed_out", False), "timed_out"),
            cancelled=_flag(d.get("cancelled", False), "cancelled"),
            error=None if d.get("error") is None else _text(d["error"], "error", MAX_SHORT),
            stopped=None if d.get("stopped") is None else _text(d["stopped"], "stopped", 400),
            gpus=[_gpu(g) for g in _list(d.get("gpus", []), "gpus", MAX_GPUS)],
            runtime={
                _text(k, "runtime key", 40): _text(v, "runtime value", 400)
                for k, v in _mapping(d.get("runtime", {}), "runtime").items()
            },
            log_tail=_text(d.get("log_tail", ""), "log_tail", MAX_FIELD),
            notes=[_text(n, "note", MAX_SHORT) for n in _list(d.get("notes", []), "notes", 20)],
            duration_s=_number(d.get("duration_s", 0.0), "duration_s"),
            tests=_tests(d.get("tests")),
        )


def _tests(data: object) -> list[TestOutcome]:
    try:
        return from_columns(data)
    except ValueError as exc:
        raise ResultError(str(exc)) from None


def gpu_to_json(gpu: GpuInfo) -> dict[str, object]:
    return {**gpu.__dict__, "processes": [p.__dict__ for p in gpu.processes]}


def _summary(d: dict[str, object]) -> Summary:
    counts = {name: _count(d.get(name, 0), name) for name in _COUNTS}
    for name, subtests in _OUTCOMES.items():
        most = counts["tests"] + sum(counts[sub] for sub in subtests)
        if counts[name] > most:
            raise ResultError(f"summary: {name} ({counts[name]}) exceeds tests ({most})")
    reasons = _mapping(d.get("skip_reasons", {}), "skip_reasons")
    if len(reasons) > 200:
        raise ResultError("summary: too many skip reasons")
    return Summary(
        **counts,
        failures_dropped=_count(d.get("failures_dropped", 0), "failures_dropped"),
        xpassed_tests=[
            _text(t, "xpassed test", MAX_SHORT)
            for t in _list(d.get("xpassed_tests", []), "xpassed_tests", MAX_FAILURES)
        ],
        skip_reasons={
            _text(k, "skip reason", MAX_SHORT): _count(v, "skip count") for k, v in reasons.items()
        },
        duration_s=_number(d.get("duration_s", 0.0), "duration_s"),
        slowest=[_slow(p) for p in _list(d.get("slowest", []), "slowest", 50)],
        failures=[_failure(f) for f in _list(d.get("failures", []), "failures", MAX_FAILURES)],
        running=[
            _text(t, "running test", MAX_SHORT)
            for t in _list(d.get("running", []), "running", MAX_RUNNING)
        ],
    )


def _failure(data: object) -> Failure:
    d = _mapping(data, "failure")
    kind = _text(d.get("kind"), "failure kind", 10)
    if kind not in ("failure", "error"):
        raise ResultError(f"failure kind {kind!r} is not failure or error")
    line = d.get("line")
    return Failure(
        test_id=_text(d.get("test_id"), "test id", MAX_SHORT),
        kind=kind,
        message=_text(d.get("message", ""), "failure message", MAX_SHORT),
        text=_text(d.get("text", ""), "failure text", MAX_FIELD),
        file=None if d.get("file") is None else _text(d["file"], "failure file", 1000),
        line=None if line is None else _count(line, "failure line"),
    )


def _slow(data: object) -> tuple[str, float]:
    pair = _list(data, "slowest entry", 2)
    if len(pair) != 2:
        raise ResultError("slowest entries are [test id, seconds]")
    return _text(pair[0], "slow test", MAX_SHORT), _number(pair[1], "slow seconds")


def _gpu(data: object) -> GpuInfo:
    d = _mapping(data, "gpu")
    optional = {"memory_total_mb", "memory_used_mb", "utilization_pct", "minor_number"}
    values = {k: None if d.get(k) is None else _count(d[k], k) for k in optional}
    texts = ("uuid", "name", "compute_capability", "driver_version", "cuda_version")
    processes = [
        GpuProcess(
            pid=_count(_mapping(p, "process").get("pid"), "pid"),
            used_memory_mb=None
            if _mapping(p, "process").get("used_memory_mb") is None
            else _count(_mapping(p, "process")["used_memory_mb"], "used_memory_mb"),
            name=_text(_mapping(p, "process").get("name", ""), "process name", 200),
        )
        for p in _list(d.get("processes", []), "processes", 100)
    ]
    return GpuInfo(
        index=_count(d.get("index"), "gpu index"),
        **{k: _text(d.get(k, ""), k, 200) for k in texts},  # type: ignore[arg-type]
        **values,  # type: ignore[arg-type]
        processes=tuple(processes),
        error=None if d.get("error") is None else _text(d["error"], "gpu error", MAX_SHORT),
    )


def _mapping(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ResultError(f"{what} must be an object")
    return value


def _list(value: object, what: str, most: int) -> list[object]:
    if not isinstance(value, list) or len(value) > most:
        raise ResultError(f"{what} must be a list of at most {most}")
    return value


def _text(value: object, what: str, most: int) -> str:
    if not isinstance(value, str) or len(value) > most:
        raise ResultError(f"{what} must be text of at most {most} characters")
    return value


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ResultError(f"{what} must be a whole number from 0 to {MAX_COUNT}")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ResultError(f"{what} must be a number of seconds")
    return float(value)


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ResultError(f"{what} must be true or false")
    return value
