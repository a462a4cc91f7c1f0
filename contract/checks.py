"""A batch's Check Run: its conclusion, title, markdown, annotations and JSON summary."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from contract.results import Failure, GpuInfo, RunReport, Summary, count_line, repo_path

MAX_BYTES = 65535  # GitHub's limit on a Check Run's summary and text
ANNOTATIONS_PER_REQUEST = 50
FAILURES_SHOWN = 50
LOG_TAIL_BYTES = 16384
TITLE_CHARS = 255
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")
_TRUNCATED = "\n\n**Truncated:** {0} more bytes not shown; the JUnit XML holds everything.\n"


class Conclusion(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    ACTION_REQUIRED = "action_required"

    @property
    def is_failure(self) -> bool:
        """The batch did not pass: failed, timed out or cancelled (exit 1, log tail shown)."""
        return self in (Conclusion.FAILURE, Conclusion.TIMED_OUT, Conclusion.CANCELLED)


@dataclass(frozen=True)
class CheckOutput:
    """The `output` of a Check Run: title, summary and text markdown, annotations."""

    title: str
    summary: str
    text: str
    annotations: list[dict[str, Any]]


def conclude(
    summary: Summary,
    *,
    allow_no_tests: bool = False,
    timed_out: bool = False,
    cancelled: bool = False,
    error: str | None = None,
) -> tuple[Conclusion, str]:
    """The verdict and its title; a batch where nothing passed is not validated, never green."""
    counts = count_line(summary) + _running_suffix(summary)
    if cancelled:
        return Conclusion.CANCELLED, _short(f"Cancelled: {counts}")
    if timed_out:
        return Conclusion.TIMED_OUT, _short(f"Timed out: {counts}")
    if error:
        completed = f"; completed: {counts}" if summary.tests or summary.running else ""
        return Conclusion.FAILURE, _short(error.strip().splitlines()[0] + completed)
    if summary.failed or summary.errors:
        return Conclusion.FAILURE, _short(counts + _xpass_suffix(summary))
    if not summary.passed and not summary.xpassed:
        if allow_no_tests:
            return Conclusion.SUCCESS, "No tests ran (allowed)"
        return Conclusion.NEUTRAL, "Not validated: " + (
            f"0 passed, {counts}" if summary.tests else counts
        )
    return Conclusion.SUCCESS, _short(counts + _xpass_suffix(summary))


def _running_suffix(summary: Summary) -> str:
    """ "; running: tests/test_x.py::test_3" for the tests a stopped run was in."""
    if not summary.running:
        return ""
    more = len(summary.running) - 1
    return f"; running: {summary.running[0]}" + (f" and {more} more" if more else "")


def xpass_notice(count: int) -> str:
    """ "2 tests marked xfail now pass: remove the marker"."""
    if count == 1:
        return "1 test marked xfail now passes: remove the marker"
    return f"{count} tests marked xfail now pass: remove the marker"


def _xpass_suffix(summary: Summary) -> str:
    return f" · {xpass_notice(summary.xpassed)}" if summary.xpassed else ""


def _short(title: str) -> str:
    return title if len(title) <= TITLE_CHARS else title[: TITLE_CHARS - 1] + "…"


def render_check_output(
    *,
    batch: str,
    sha: str,
    summary: Summary,
    conclusion: Conclusion,
    title: str,
    gpus: Sequence[GpuInfo],
    host: str = "",
    log_tail: str = "",
    notes: Sequence[str] = (),
    runtime: Mapping[str, str] | None = None,
) -> CheckOutput:
    """Markdown a reader can trust: names render literally, and both parts fit GitHub's limit."""
    summary_md = fit_markdown(
        [
            f"## gpuci / batch {inline(batch)}: {inline(title)}\n",
            _counts_table(summary),
            _subtests_line(summary),
            _running_section(summary),
            _xpass_section(summary),
            _notes_section(notes),
            _skips_section(summary),
            _slowest_section(summary),
            _gpus_section(gpus),
            _runtime_section(runtime or {}),
            _provenance(sha, host),
        ]
    )
    log = _log_section(log_tail) if conclusion.is_failure and log_tail else ""
    text_md = fit_markdown(_failure_sections(summary), MAX_BYTES - len(log.encode()) - 1)
    text_md = "\n".join(part for part in (text_md, log) if part)
    return CheckOutput(title, summary_md, text_md, failure_annotations(summary.failures))


def _provenance(sha: str, host: str) -> str:
    where = f" on host {inline(host)}" if host else ""
    return (f"Commit {inline(sha)}" if sha else "Local source (no commit)") + where + "\n"


def as_terminal(markdown: str) -> str:
    """Check Run markdown for a terminal: markdown escapes and HTML entities undone."""
    return html.unescape(re.sub(r"\\([\\`*_{}\[\]()#+\-.!|~>])", r"\1", markdown))


def inline(text: str) -> str:
    """Text that renders literally in markdown, in a table cell too: no HTML, no formatting."""
    flat = " ".join(str(text).split())
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(flat, quote=False))


def fenced(body: str, info: str = "") -> str:
    """A code block whose fence no backtick run in body can close."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{body.rstrip()}\n{fence}\n"


def fit_markdown(sections: Sequence[str], limit: int = MAX_BYTES) -> str:
    """Whole sections while they fit in `limit` UTF-8 bytes, then a visible truncation note."""
    sections = [s for s in sections if s]
    out: list[str] = []
    used = 0
    for i, section in enumerate(sections):
        size = len(section.encode()) + 1
        if used + size <= limit:
            out.append(section)
            used += size
            continue
        left = sum(len(s.encode()) + 1 for s in sections[i:])
        note = _TRUNCATED.format(left)
        out.append(_cut(section, limit - used - len(note.encode()) - 64))
        out.append(note)
        break
    return "\n".join(out)


def _cut(section: str, room: int) -> str:
    """The head of a section in `room` bytes; a cut code block is closed again."""
    if room <= 0:
        return ""
    head = section.encode()[:room].decode(errors="ignore")
    fence = re.match(r"(`{3,})", section)
    if fence and not head.rstrip().endswith(fence.group(1)):
        head = head.rstrip("`") + "\n" + fence.group(1) + "\n"
    return head


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "---") -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _counts_table(s: Summary) -> str:
    header = ["tests", "passed", "failed", "errors", "skipped", "xfailed", "xpassed", "reruns"]
    values = [s.tests, s.passed, s.failed, s.errors, s.skipped, s.xfailed, s.xpassed, s.reruns]
    return _table([*header, "duration"], [[*map(str, values), _duration(s.duration_s)]], "--:")


def _subtests_line(s: Summary) -> str:
    """pytest's way: subtests beside the tests, their failures and skips in the counts."""
    counts = [(s.subtests_passed, "passed"), (s.subtests_failed, "failed")]
    counts.append((s.subtests_skipped, "skipped"))
    said = ", ".join(f"{n} {word}" for n, word in counts if n)
    if not said:
        return ""
    return (
        f"Subtests: {said}. A failed subtest counts as failed and a skipped one as skipped,"
        " as in pytest's summary line; the tests column counts tests.\n"
    )


def _running_section(s: Summary) -> str:
    if not s.running:
        return ""
    rows = "".join(f"- {inline(test)}\n" for test in s.running)
    return f"### Running when the run stopped ({len(s.running)})\n\n{rows}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"


def _xpass_section(s: Summary) -> str:
    if not s.xpassed:
        return ""
    ids = "".join(f"> - {inline(tid)}\n" for tid in s.xpassed_tests)
    return f"> [!WARNING]\n> **{xpass_notice(s.xpassed)}**\n>\n{ids}"


def _notes_section(notes: Sequence[str]) -> str:
    return "".join(f"- {inline(note)}\n" for note in notes)


def _skips_section(s: Summary) -> str:
    if not s.skip_reasons:
        return ""
    rows = sorted(s.skip_reasons.items(), key=lambda item: (-item[1], item[0]))
    table = _table(["reason", "tests"], [[inline(r), str(n)] for r, n in rows])
    return f"### Skipped ({s.skipped})\n\n{table}"


SLOWEST_MIN_S = 0.01  # tests faster than this are noise in the "Slowest tests" table


def _slowest_section(s: Summary) -> str:
    slow = [(tid, seconds) for tid, seconds in s.slowest if seconds >= SLOWEST_MIN_S]
    if not slow:
        return ""
    rows = [[inline(tid), f"{seconds:.2f}"] for tid, seconds in slow]
    return "### Slowest tests\n\n" + _table(["test", "seconds"], rows)


def _gpus_section(gpus: Sequence[GpuInfo]) -> str:
    if not gpus:
        return "No GPUs (CPU batch).\n"
    header = ["#", "model", "CC", "memory", "driver", "CUDA"]
    return "### GPUs\n\n" + _table(header, [_gpu_row(g) for g in gpus])


def _gpu_row(g: GpuInfo) -> list[str]:
    texts = [g.name, g.compute_capability]
    memory = _memory(g.memory_total_mb)
    return [
        str(g.index),
        *map(inline, texts),
        memory,
        inline(g.driver_version),
        inline(g.cuda_version),
    ]


# What the Check Run says of the runtime, in this order, as the run saw it.
RUNTIME_FIELDS = (
    ("profile", "profile"), ("base", "base"), ("image", "image"), ("digest", "image digest"),
    ("python", "Python"), ("torch", "torch"), ("cuda", "torch CUDA"), ("installer", "installer"),
    ("sandbox", "sandbox"), ("network", "network"),
)  # fmt: skip


def _runtime_section(runtime: Mapping[str, str]) -> str:
    rows = [[label, inline(runtime[key])] for key, label in RUNTIME_FIELDS if runtime.get(key)]
    return "### Runtime\n\n" + _table(["", "as the run saw it"], rows) if rows else ""


def _memory(mb: int | None) -> str:
    return "?" if mb is None else f"{mb / 1024:.1f} GiB"


def _failure_sections(s: Summary) -> list[str]:
    shown = s.failures[:FAILURES_SHOWN]
    if not shown:
        return []
    total = len(s.failures) + s.failures_dropped
    sections = [
        f"## Failures ({len(shown)} of {total} shown)\n" if total > len(shown) else "## Failures\n"
    ]
    for failure in shown:
        file = repo_path(failure.file)
        where = f" at {inline(file)}:{failure.line}" if file and failure.line else ""
        sections.append(f"### {failure.kind.upper()} {inline(failure.test_id)}{where}\n")
        sections.append(fenced(failure.text or failure.message, "text"))
    return sections


def _log_section(log_tail: str) -> str:
    """The last LOG_TAIL_BYTES of the log: where the error is."""
    tail = log_tail.encode()[-LOG_TAIL_BYTES:].decode(errors="ignore")
    cut = len(log_tail.encode()) - len(tail.encode())
    note = f"({cut} earlier bytes not shown)\n\n" if cut else ""
    return f"## Log tail\n\n{note}{fenced(tail, 'text')}"


def failure_annotations(failures: Sequence[Failure]) -> list[dict[str, Any]]:
    """GitHub check-run annotations, one per failure whose file is a path in the repository
    (a host's report is not trusted to give one: an absolute path or URL is left out)."""
    return [
        {
            "path": repo_path(f.file),
            "start_line": f.line or 1,
            "end_line": f.line or 1,
            "annotation_level": "failure",
            "title": _short(f"{f.test_id} ({f.kind})"),
            "message": (f.message or f.kind)[:4000],
            **({"raw_details": f.text[:60000]} if f.text else {}),
        }
        for f in failures
        if repo_path(f.file)
    ]


def annotation_chunks(
    annotations: Sequence[dict[str, Any]], size: int = ANNOTATIONS_PER_REQUEST
) -> list[list[dict[str, Any]]]:
    """Annotations in batches of at most `size`, as GitHub takes them per request."""
    return [list(annotations[i : i + size]) for i in range(0, len(annotations), size)]


def summary_json(
    *,
    batch: str,
    sha: str,
    conclusion: Conclusion,
    title: str,
    summary: Summary,
    gpus: Sequence[GpuInfo],
) -> dict[str, Any]:
    """The `--json` summary: the design's keys, then reruns and the failures kept."""
    s = summary
    return {
        "batch": batch,
        "sha": sha,
        "conclusion": str(conclusion),
        "title": title,
        "tests": s.tests,
        "passed": s.passed,
        "failed": s.failed,
        "errors": s.errors,
        "skipped": s.skipped,
        "xfailed": s.xfailed,
        "xpassed": s.xpassed,
        "xpassed_tests": list(s.xpassed_tests),
        "skip_reasons": dict(s.skip_reasons),
        "duration_s": s.duration_s,
        "gpus": [gpu_json(g) for g in gpus],
        "reruns": s.reruns,
        "subtests_passed": s.subtests_passed,
        "subtests_failed": s.subtests_failed,
        "subtests_skipped": s.subtests_skipped,
        "running": list(s.running),
        "failures": [
            {
                "test_id": f.test_id,
                "kind": f.kind,
                "message": f.message,
                "file": f.file,
                "line": f.line,
            }
            for f in s.failures
        ],
    }


def gpu_json(gpu: GpuInfo) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_mb": gpu.memory_total_mb,
        "compute_capability": gpu.compute_capability,
        "driver": gpu.driver_version,
        "cuda": gpu.cuda_version,
    }


@dataclass(frozen=True)
class Verdict:
    """A run's report judged: its conclusion and title, its Check Run output, its JSON."""

    conclusion: Conclusion
    title: str
    output: CheckOutput
    data: dict[str, Any]  # summary_json, plus host, notes, runtime


def judge(report: RunReport, *, batch: str, allow_no_tests: bool, sha: str, host: str) -> Verdict:
    """What a run's report means, decided the same way on the host (`gpuci run-batch`) and by
    the bot (a worker's result): the bot judges with its own config, the host only reports."""
    conclusion, title = conclude(
        report.summary,
        allow_no_tests=allow_no_tests,
        timed_out=report.timed_out,
        cancelled=report.cancelled,
        error=report.error,
    )
    if report.stopped:
        title = _short(f"Stopped: {report.stopped}")
    output = render_check_output(
        batch=batch,
        sha=sha,
        summary=report.summary,
        conclusion=conclusion,
        title=title,
        gpus=report.gpus,
        host=host,
        log_tail=report.log_tail,
        notes=report.notes,
        runtime=report.runtime,
    )
    data = summary_json(
        batch=batch,
        sha=sha,
        conclusion=conclusion,
        title=title,
        summary=report.summary,
        gpus=report.gpus,
    )
    data.update(host=host, notes=list(report.notes), runtime=dict(report.runtime))
    return Verdict(conclusion, title, output, data)
