"""Chaos: 500 MB JUnit files, real and hostile, parsed in bounded memory. Run with `make chaos`.

Each file is written to tmp_path in a streaming fashion and parsed in a fresh process, whose
peak RSS (VmHWM, Linux) above its peak after the imports is the parse's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc"),
]

ROOT = Path(__file__).resolve().parent.parent
TARGET = 500 * 10**6  # bytes per file
MEMORY_BOUND_MIB = 32

PARSE = """
import json, sys
from pathlib import Path
from workers.junit import JUnitError, parse_junit
def peak_kib():  # this process's own peak: ru_maxrss may carry the parent's over exec
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0])
before = peak_kib()
try:
    s = parse_junit([Path(sys.argv[1])])
    out = {"counts": [s.tests, s.passed, s.failed, s.errors, s.skipped, s.xfailed],
           "failures": [len(s.failures), s.failures_dropped, max(len(f.text) for f in s.failures)],
           "reasons": s.skip_reasons}
except JUnitError as exc:
    out = {"error": str(exc)}
grown = peak_kib() - before
print(json.dumps({**out, "grown_mib": grown / 1024}))
"""


def parse_in_fresh_process(path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PARSE, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    grown = float(str(result["grown_mib"]))
    assert grown < MEMORY_BOUND_MIB, f"peak RSS grew {grown:.1f} MiB parsing {path}"
    return result


def write_stream(path: Path, parts: Iterator[str | bytes]) -> int:
    """Writes parts until the file holds TARGET bytes; returns its size."""
    with path.open("wb") as out:
        for part in parts:
            out.write(part.encode() if isinstance(part, str) else part)
        return out.tell()


def pytest_like(cases: int, long_every: int, long_chars: int) -> Iterator[str]:
    """1 in 10 failing (every long_every-th with a traceback of long_chars), 1 in 10 skipped."""
    frame = '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", '
    frame += "line 1511, in _wrapped_call_impl\n    return self._call_impl(*args, **kwargs)\n"
    long_text = frame * (long_chars // len(frame))
    yield '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
    yield f'<testsuite name="pytest" tests="{cases}" time="86400.0">'
    batch: list[str] = []
    for i in range(cases):
        module = f"tests/test_m{i % 300}"
        attrs = f'classname="{module.replace("/", ".")}.TestModel" name="test_case_{i}[fp8]" '
        attrs += f'file="{module}.py" line="{i % 900}" time="{(i % 997) / 100:.3f}"'
        if i % 10 == 0:
            text = long_text if i % long_every == 0 else "    x = model(batch)\n" * 8
            body = f'<failure message="AssertionError: mismatch {i}">{text}'
            body += f"{module}.py:{i % 900 + 4}: AssertionError</failure>"
        elif i % 10 == 1:
            body = f'<skipped type="pytest.skip" message="needs {i % 4 + 1} GPUs">skip</skipped>'
        else:
            body = "<system-out>loss 0.125\nstep done\n</system-out>"
        batch.append(f"<testcase {attrs}>{body}</testcase>\n")
        if len(batch) == 10_000:
            yield "".join(batch)
            batch.clear()
    yield "".join(batch)
    yield "</testsuite></testsuites>"


def then_filler(head: str, filler: bytes) -> Iterator[str | bytes]:
    yield head
    block = filler * (2**20 // len(filler))
    for _ in range(TARGET // len(block)):
        yield block


def test_500mb_of_pytest_junit_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    cases = 1_500_000
    size = write_stream(path, pytest_like(cases, long_every=1_000, long_chars=130_000))
    assert size > TARGET * 0.9, size
    result = parse_in_fresh_process(path)
    os.unlink(path)
    assert result["counts"] == [cases, 1_200_000, 150_000, 0, 150_000, 0]
    kept, dropped, longest = result["failures"]  # type: ignore[misc]
    assert (kept, dropped) == (200, 150_000 - 200)
    assert longest < 4100  # a 130 kB traceback is kept within max_text_chars
    assert result["reasons"] == {"needs 2 GPUs": 75_000, "needs 4 GPUs": 75_000}


@pytest.mark.parametrize(
    ("head", "filler", "expected"),
    [
        pytest.param("", b"\x8f\x00<>&]]>garbage\xff", "not well-formed XML", id="garbage"),
        pytest.param(
            '<testsuites><testsuite><testcase name="t"><failure message="m">',
            b"Traceback line that never ends\n",
            "truncated or corrupt",
            id="never-closed-element",
        ),
        pytest.param(
            '<testsuites><testsuite><testcase name="',
            b"a" * 64,
            "longer than 8 MiB",
            id="never-closed-attribute",
        ),
        pytest.param(
            "<testsuites><!--", b"comment " * 8, "longer than 8 MiB", id="endless-comment"
        ),
    ],
)
def test_500mb_of_hostile_input_is_refused_in_bounded_memory(
    tmp_path: Path, head: str, filler: bytes, expected: str
) -> None:
    path = tmp_path / "junit.xml"
    assert write_stream(path, then_filler(head, filler)) > TARGET * 0.9
    result = parse_in_fresh_process(path)
    os.unlink(path)
    error = str(result.get("error"))
    assert error.startswith(str(path)), result
    assert expected in error, error
