"""Benchmark: parse_junit against junitparser on a generated 100,000-testcase JUnit file."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each parser runs in a fresh process so that its peak RSS is its own: VmHWM, which exec
# resets (ru_maxrss can carry the parent's peak over exec). A script's body sets `counts`.
TIMED = """
import json, sys, time
from collections import Counter
from pathlib import Path
{imports}
def peak_kb():
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0])
before = peak_kb()
start = time.perf_counter()
{body}
seconds = time.perf_counter() - start
rss = peak_kb()
print(json.dumps({{"seconds": seconds, "rss_kb": rss, "before_kb": before, "counts": counts}}))
"""

GPUCI = TIMED.format(
    imports="from workers.junit import parse_junit",
    body="""
s = parse_junit([Path(sys.argv[1])])
counts = [s.tests, s.passed, s.failed, s.errors, s.skipped + s.xfailed]
""",
)

JUNITPARSER = TIMED.format(
    imports="from junitparser import Error, Failure, JUnitXml, Skipped",
    body="""
seen = Counter()
for suite in JUnitXml.fromfile(sys.argv[1]):
    for case in suite:
        kinds = {type(r) for r in case.result}
        seen["tests"] += 1
        seen["passed"] += not kinds
        seen["failed"] += Failure in kinds
        seen["errors"] += Error in kinds
        seen["skipped"] += Skipped in kinds
counts = [seen[k] for k in ("tests", "passed", "failed", "errors", "skipped")]
""",
)

# What bounds a streaming parser in Python (--floors): expat alone, expat calling handlers
# that do nothing, and ElementTree's C tree builder read by end events (iterparse-style).
EXPAT_FEED = """
with open(sys.argv[1], "rb") as stream:
    while chunk := stream.read(1 << 20):
        expat.Parse(chunk, False)
expat.Parse(b"", True)
counts = []
"""
FLOORS = {
    "expat, no handlers": TIMED.format(
        imports="from xml.parsers.expat import ParserCreate",
        body="expat = ParserCreate()" + EXPAT_FEED,
    ),
    "expat, empty handlers": TIMED.format(
        imports="from xml.parsers.expat import ParserCreate",
        body="""
expat = ParserCreate()
expat.StartElementHandler = lambda tag, attrs: None
expat.EndElementHandler = lambda tag: None
"""
        + EXPAT_FEED,
    ),
    "ElementTree end events": TIMED.format(
        imports="from xml.etree.ElementTree import XMLPullParser",
        body="""
parser, seen = XMLPullParser(events=("end",)), Counter()
with open(sys.argv[1], "rb") as stream:
    while chunk := stream.read(1 << 20):
        parser.feed(chunk)
        for _, element in parser.read_events():
            if element.tag == "testcase":
                kinds = {child.tag for child in element}
                seen["tests"] += 1
                seen["passed"] += not kinds & {"failure", "error", "skipped"}
                seen["failed"] += "failure" in kinds
                seen["errors"] += "error" in kinds
                seen["skipped"] += "skipped" in kinds
                element.clear()
parser.close()
counts = [seen[k] for k in ("tests", "passed", "failed", "errors", "skipped")]
""",
    ),
}


def write_junit(path: Path, cases: int, traceback_lines: int) -> None:
    """pytest-like output: 1 in 10 failing with a traceback, 1 in 10 skipped, 1 in 20 xfail."""
    tb = "".join(f"    x = model(batch)  # step {n}\n" for n in range(traceback_lines))
    with path.open("w", encoding="utf-8") as out:
        out.write('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">')
        out.write(f'<testsuite name="pytest" tests="{cases}" time="3600.0">')
        for i in range(cases):
            out.write(_testcase(i, tb))
        out.write("</testsuite></testsuites>")


def _testcase(i: int, tb: str) -> str:
    module = f"tests/test_m{i % 200}"
    attrs = f'classname="{module.replace("/", ".")}.TestModel" name="test_case_{i}[bf16]" '
    attrs += f'file="{module}.py" line="{i % 900}" time="{(i % 997) / 100:.3f}"'
    if i % 10 == 0:
        body = f'<failure message="AssertionError: mismatch {i}">{tb}'
        body += f"{module}.py:{i % 900 + 4}: AssertionError</failure>"
    elif i % 10 == 1:
        body = f'<skipped type="pytest.skip" message="needs {i % 4 + 1} GPUs">skip</skipped>'
    elif i % 20 == 2:
        body = '<skipped type="pytest.xfail" message="known cuBLAS bug"/>'
    else:
        body = "<system-out>loss 0.125\nstep done\n</system-out>"
    return f"<testcase {attrs}>{body}</testcase>\n"


def measure(code: str, path: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--traceback-lines", type=int, default=30)
    parser.add_argument(
        "--repeat", type=int, default=5, help="fresh processes per parser; the best time counts"
    )
    parser.add_argument(
        "--floors", action="store_true", help="also time expat and ElementTree doing no work"
    )
    args = parser.parse_args()
    scripts = {"gpuci parse_junit": GPUCI, "junitparser": JUNITPARSER}
    if args.floors:
        scripts |= FLOORS
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in scripts}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "junit.xml"
        write_junit(path, args.cases, args.traceback_lines)
        size_mb = path.stat().st_size / 2**20
        print(f"{args.cases} testcases, {size_mb:.1f} MiB of JUnit XML")
        for _ in range(max(args.repeat, 1)):  # interleaved, so that a busy spell hits all
            for name, code in list(scripts.items()):
                try:
                    runs[name].append(measure(code, path))
                except subprocess.CalledProcessError as exc:
                    print(f"{name} not measured: {exc.stderr.strip().splitlines()[-1]}")
                    if name == "junitparser":
                        print("  it is a benchmark-only tool: .venv/bin/pip install junitparser")
                    del scripts[name]
    report({name: best(tries) for name, tries in runs.items() if tries})


def best(tries: list[dict[str, object]]) -> dict[str, object]:
    """The fastest try's figures, with the largest memory growth of all tries."""
    fastest = dict(min(tries, key=lambda r: float(str(r["seconds"]))))
    worst = max(tries, key=growth_mib)
    fastest["rss_kb"], fastest["before_kb"] = worst["rss_kb"], worst["before_kb"]
    fastest["all_seconds"] = ", ".join(
        f"{s:.2f}" for s in sorted(float(str(r["seconds"])) for r in tries)
    )
    return fastest


def growth_mib(result: dict[str, object]) -> float:
    """Peak RSS during the parse, above the process's peak after its imports."""
    return max(int(str(result["rss_kb"])) - int(str(result["before_kb"])), 0) / 1024


def report(results: dict[str, dict[str, object]]) -> None:
    for name, r in results.items():
        seconds, base = float(str(r["seconds"])), int(str(r["before_kb"])) / 1024
        print(f"{name:22} {seconds:6.2f} s  peak RSS +{growth_mib(r):6.1f} MiB over {base:.1f} MiB")
        print(f"{'':22} all tries: {r['all_seconds']} s")
        if r["counts"]:
            print(f"{'':22} counts (tests passed failed errors skipped): {r['counts']}")
    ours, theirs = results.get("gpuci parse_junit"), results.get("junitparser")
    if ours and theirs:
        t = float(str(theirs["seconds"])) / float(str(ours["seconds"]))
        m = growth_mib(theirs) / max(growth_mib(ours), 0.1)
        print(f"junitparser / gpuci: time x{t:.2f}, memory growth x{m:.0f} (gpuci floor 0.1 MiB)")


if __name__ == "__main__":
    main()
