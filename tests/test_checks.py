"""Check Run verdicts and text: conclusions, rendering, escaping, GitHub's size limits."""

from __future__ import annotations

import json
import re

import pytest

from contract.checks import (
    MAX_BYTES,
    Conclusion,
    annotation_chunks,
    conclude,
    fenced,
    inline,
    render_check_output,
    summary_json,
)
from contract.results import Failure, GpuInfo, Summary

H20 = GpuInfo(
    index=0,
    uuid="GPU-1234",
    name="NVIDIA H20",
    memory_total_mb=97871,
    compute_capability="9.0",
    driver_version="550.54.15",
    cuda_version="12.4",
)
HOSTILE = "tests/test_x.py::test_y[<script>alert(1)</script>|*bold*`code`]"


def failure(i: int = 0, **fields: object) -> Failure:
    values: dict[str, object] = {
        "test_id": f"tests/test_x.py::test_{i}",
        "kind": "failure",
        "message": f"AssertionError: {i}",
        "text": f"assert {i} == 1\ntests/test_x.py:{i + 10}: AssertionError",
        "file": "tests/test_x.py",
        "line": i + 10,
    }
    values.update(fields)
    return Failure(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("summary", "options", "expected"),
    [
        (Summary(tests=12, passed=12), {}, (Conclusion.SUCCESS, "12 passed")),
        (
            Summary(tests=14, passed=12, xpassed=2),
            {},
            (
                Conclusion.SUCCESS,
                "12 passed, 2 xpassed · 2 tests marked xfail now pass: remove the marker",
            ),
        ),
        (
            Summary(tests=2, passed=1, xpassed=1),
            {},
            (
                Conclusion.SUCCESS,
                "1 passed, 1 xpassed · 1 test marked xfail now passes: remove the marker",
            ),
        ),
        (
            Summary(tests=4, skipped=4),
            {},
            (Conclusion.NEUTRAL, "Not validated: 0 passed, 4 skipped"),
        ),
        (Summary(), {}, (Conclusion.NEUTRAL, "Not validated: no tests ran")),
        (
            Summary(tests=3, xfailed=3),
            {},
            (Conclusion.NEUTRAL, "Not validated: 0 passed, 3 xfailed"),
        ),
        (Summary(), {"allow_no_tests": True}, (Conclusion.SUCCESS, "No tests ran (allowed)")),
        (
            Summary(tests=4, skipped=4),
            {"allow_no_tests": True},
            (Conclusion.SUCCESS, "No tests ran (allowed)"),
        ),
        (
            Summary(tests=9, passed=5, failed=3, errors=1),
            {"allow_no_tests": True},
            (Conclusion.FAILURE, "3 failed, 5 passed, 1 error"),
        ),
        (Summary(tests=2, passed=1, errors=1), {}, (Conclusion.FAILURE, "1 passed, 1 error")),
        (
            Summary(tests=5, passed=5),
            {"error": "Setup failed: pip install exited 1\nfull log below"},
            (Conclusion.FAILURE, "Setup failed: pip install exited 1; completed: 5 passed"),
        ),
        (
            Summary(),
            {"error": "Setup failed: pip install exited 1"},
            (Conclusion.FAILURE, "Setup failed: pip install exited 1"),
        ),
        (
            Summary(tests=2, passed=1, failed=1, running=["t.py::test_3", "t.py::test_4"]),
            {"timed_out": True},
            (
                Conclusion.TIMED_OUT,
                "Timed out: 1 failed, 1 passed; running: t.py::test_3 and 1 more",
            ),
        ),
        (
            Summary(tests=5, passed=3, failed=1),
            {"timed_out": True},
            (Conclusion.TIMED_OUT, "Timed out: 1 failed, 3 passed"),
        ),
        (Summary(), {"cancelled": True}, (Conclusion.CANCELLED, "Cancelled: no tests ran")),
        (
            Summary(tests=5, passed=3, failed=1),
            {"cancelled": True, "timed_out": True},
            (Conclusion.CANCELLED, "Cancelled: 1 failed, 3 passed"),
        ),
    ],
)
def test_conclude(
    summary: Summary, options: dict[str, object], expected: tuple[Conclusion, str]
) -> None:
    assert conclude(summary, **options) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("conclusion", "is_failure"),
    [
        (Conclusion.SUCCESS, False),
        (Conclusion.NEUTRAL, False),
        (Conclusion.ACTION_REQUIRED, False),
        (Conclusion.FAILURE, True),
        (Conclusion.TIMED_OUT, True),
        (Conclusion.CANCELLED, True),
    ],
)
def test_which_conclusions_fail_the_batch(conclusion: Conclusion, is_failure: bool) -> None:
    assert conclusion.is_failure is is_failure


def render(summary: Summary, **overrides: object) -> tuple[str, str, list[dict[str, object]]]:
    conclusion, title = conclude(summary)
    args: dict[str, object] = {
        "batch": "10",
        "sha": "a" * 40,
        "summary": summary,
        "conclusion": conclusion,
        "title": title,
        "gpus": [H20],
        "host": "h20-01",
    }
    args.update(overrides)
    out = render_check_output(**args)  # type: ignore[arg-type]
    return out.summary, out.text, out.annotations


def test_summary_shows_counts_gpus_sha_skips_and_slowest() -> None:
    summary = Summary(
        tests=10,
        passed=6,
        skipped=4,
        skip_reasons={"needs 4 GPUs": 3, "no bf16": 1},
        duration_s=75.2,
        slowest=[("tests/test_a.py::test_big", 40.0)],
    )
    md, text, annotations = render(summary)
    assert "| 10 | 6 | 0 | 0 | 4 | 0 | 0 | 0 | 1m 15s |" in md
    assert "| needs 4 GPUs | 3 |" in md
    assert "| no bf16 | 1 |" in md
    assert "| tests/test\\_a\\.py::test\\_big | 40.00 |" in md
    assert "| 0 | NVIDIA H20 | 9\\.0 | 95.6 GiB | 550\\.54\\.15 | 12\\.4 |" in md
    assert "a" * 40 in md
    assert "h20\\-01" in md
    assert (text, annotations) == ("", [])


def test_cpu_batch_says_so() -> None:
    md, _, _ = render(Summary(tests=1, passed=1), gpus=[])
    assert "No GPUs (CPU batch)." in md
    assert "### GPUs" not in md


def test_xpass_notice_lists_the_tests() -> None:
    ids = ["tests/test_a.py::test_one", "tests/test_a.py::test_two"]
    md, _, _ = render(Summary(tests=3, passed=1, xpassed=2, xpassed_tests=ids))
    assert "2 tests marked xfail now pass: remove the marker" in md
    assert "> - tests/test\\_a\\.py::test\\_one" in md
    assert "> - tests/test\\_a\\.py::test\\_two" in md


def test_failures_give_details_log_tail_and_annotations() -> None:
    summary = Summary(tests=3, passed=1, failed=1, errors=1)
    summary.failures = [failure(1), failure(2, kind="error", file=None, line=None)]
    _, text, annotations = render(summary, log_tail="E   CUDA error: out of memory")
    assert "### FAILURE tests/test\\_x\\.py::test\\_1 at tests/test\\_x\\.py:11" in text
    assert "```text\nassert 1 == 1\ntests/test_x.py:11: AssertionError\n```" in text
    assert "## Log tail\n\n```text\nE   CUDA error: out of memory\n```" in text
    assert annotations == [
        {
            "path": "tests/test_x.py",
            "start_line": 11,
            "end_line": 11,
            "annotation_level": "failure",
            "title": "tests/test_x.py::test_1 (failure)",
            "message": "AssertionError: 1",
            "raw_details": "assert 1 == 1\ntests/test_x.py:11: AssertionError",
        }
    ]


def test_log_tail_is_left_out_when_the_batch_passed() -> None:
    _, text, _ = render(Summary(tests=1, passed=1), log_tail="all fine")
    assert "all fine" not in text


def unescaped_pipes(row: str) -> int:
    return len(re.findall(r"(?<!\\)\|", row))


def test_markdown_and_html_in_names_render_literally() -> None:
    summary = Summary(
        tests=2,
        passed=1,
        xpassed=1,
        xpassed_tests=[HOSTILE],
        skip_reasons={"<b>no</b> | *GPU*": 1},
        slowest=[(HOSTILE, 1.0)],
    )
    md, _, _ = render(summary, host="<img src=x onerror=alert(1)>")
    assert "<script>" not in md
    assert "<img" not in md
    assert "<b>" not in md
    assert "&lt;script&gt;alert\\(1\\)&lt;/script&gt;\\|\\*bold\\*\\`code\\`" in md
    row = next(line for line in md.splitlines() if "GPU" in line and "no" in line)
    assert unescaped_pipes(row) == 3  # | reason | count |: the reason's own pipe is escaped


def test_fence_outlasts_backticks_in_tracebacks() -> None:
    block = fenced("```\nnot the end\n````")
    assert block.startswith("`````\n")
    assert block.endswith("\n`````\n")


@pytest.mark.parametrize("text", ["plain", "a|b", "*x* _y_ `z`", "<a href=x>", "#1 [l](u) ~s~"])
def test_inline_text_has_no_active_markdown(text: str) -> None:
    escaped = inline(text)
    assert not re.search(r"(?<!\\)[|*_`\[\]#~<>]", escaped)


def test_huge_outputs_fit_githubs_limit_with_a_note() -> None:
    summary = Summary(tests=5000, failed=5000)
    summary.failures = [failure(i, text="é" * 3000 + f"\nline {i}") for i in range(200)]
    summary.skip_reasons = {f"reason {i} " + "ü" * 500: 1 for i in range(300)}
    md, text, _ = render(summary, log_tail="ö" * 200_000 + "\nCUDA error: last line")
    for part in (md, text):
        assert len(part.encode()) <= MAX_BYTES
        assert "**Truncated:**" in part
        assert part.count("```") % 2 == 0  # every code block cut short is closed again
    assert text.endswith("CUDA error: last line\n```\n")  # the log tail keeps its end


def test_text_that_fits_is_not_truncated() -> None:
    summary = Summary(tests=1, failed=1, failures=[failure(1)])
    md, text, _ = render(summary)
    assert "Truncated" not in md + text


@pytest.mark.parametrize(
    ("count", "sizes"), [(0, []), (50, [50]), (51, [50, 1]), (120, [50, 50, 20])]
)
def test_annotations_go_in_chunks_of_50(count: int, sizes: list[int]) -> None:
    summary = Summary(tests=count, failed=count, failures=[failure(i) for i in range(count)])
    _, _, annotations = render(summary)
    chunks = annotation_chunks(annotations)
    assert [len(c) for c in chunks] == sizes
    assert [a for chunk in chunks for a in chunk] == annotations


def test_failure_without_a_line_annotates_line_one() -> None:
    summary = Summary(tests=1, errors=1, failures=[failure(kind="error", line=None)])
    _, _, (annotation,) = render(summary)
    assert (annotation["start_line"], annotation["end_line"]) == (1, 1)


def test_summary_json_has_the_designs_keys() -> None:
    summary = Summary(
        tests=4,
        passed=2,
        skipped=1,
        xpassed=1,
        xpassed_tests=["t::x"],
        skip_reasons={"r": 1},
        duration_s=1.5,
    )
    data = summary_json(
        batch="2",
        sha="b" * 40,
        conclusion=Conclusion.SUCCESS,
        title="t",
        summary=summary,
        gpus=[H20],
    )
    design_keys = "batch sha conclusion title tests passed failed errors skipped xfailed xpassed"
    design_keys += " xpassed_tests skip_reasons duration_s gpus"
    assert set(design_keys.split()) <= set(data)
    assert data["conclusion"] == "success"
    assert (data["passed"], data["xpassed_tests"], data["skip_reasons"]) == (2, ["t::x"], {"r": 1})
    assert data["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-1234",
            "name": "NVIDIA H20",
            "memory_mb": 97871,
            "compute_capability": "9.0",
            "driver": "550.54.15",
            "cuda": "12.4",
        }
    ]
    assert json.loads(json.dumps(data)) == data
