"""Benchmark: the time from "GPUs leased" to "pytest starts" for each way a run's environment
is made, through the real runner (`workers.runner.run_batch`), real bubblewrap, real installs.

The run's setup installs a small local project with three local dependencies (wheels in a
local folder: nothing from the network), `pip install --no-index --find-links WHEELS -e .`:

1. today: the worker's shared environment (setup installs into it, pytest runs from it);
2. a fresh environment layered on a base, installs by uv, then by pip; each with a cold package
   cache (a new one per run) and a warm one (kept between runs);
3. the same inside the sandbox.

A conftest in the project writes the clock when pytest configures itself; the clock before
`run_batch` is "GPUs leased" (the leases are taken before the runner is called). Figures are
p50 and p90 over the repeats; targets (issue #12): warm layered + sandbox adds at most 1.5 s
(p50) over today, and uv's warm install is at least 5x faster than pip's.

    .venv/bin/python bench/run_env.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.packages: local wheels and projects, no network

from contract.config import Batch, Config, Runtime  # noqa: E402
from tests.packages import module_wheel, write_project  # noqa: E402
from workers import sandbox  # noqa: E402
from workers.caches import CachePlan  # noqa: E402
from workers.envs import find_uv  # noqa: E402
from workers.runner import Environment, RunRequest, run_batch  # noqa: E402

DEPENDENCIES = ("dep_alpha", "dep_beta", "dep_gamma")
STARTED = """
import time
from pathlib import Path


def pytest_configure(config):
    Path("pytest-started").write_text(repr(time.time()))
"""
TEST = "import benchproj, dep_alpha\n\ndef test_imports():\n    assert benchproj.__version__\n"


@dataclass(frozen=True)
class Variant:
    name: str
    layered: bool
    uv: bool
    warm: bool
    sandboxed: bool


VARIANTS = [
    Variant("today: shared environment", False, False, True, False),
    Variant("layered, uv, cold cache", True, True, False, False),
    Variant("layered, uv, warm cache", True, True, True, False),
    Variant("layered, pip, cold cache", True, False, False, False),
    Variant("layered, pip, warm cache", True, False, True, False),
    Variant("sandbox + layered, uv, cold", True, True, False, True),
    Variant("sandbox + layered, uv, warm", True, True, True, True),
    Variant("sandbox + layered, pip, warm", True, False, True, True),
]


class Bench:
    def __init__(self, work: Path):
        self.work = work
        self.wheels = work / "wheels"
        for name in DEPENDENCIES:
            module_wheel(self.wheels, name, "1.0")
        self.project = write_project(work / "project", "benchproj", "0.1", DEPENDENCIES)
        (self.project / "tests").mkdir()
        (self.project / "tests" / "conftest.py").write_text(STARTED)
        (self.project / "tests" / "test_it.py").write_text(TEST)
        self.base = self._base(work / "base")
        self.uv = find_uv()
        self.bwrap = sandbox.bwrap_path()

    def _base(self, root: Path) -> Path:
        """A base environment with pytest (from this one, by a .pth: no download) and pip."""
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        site = next(root.glob("lib/python*/site-packages"))
        here = next(p for p in sys.path if p.endswith("site-packages"))
        (site / "worker.pth").write_text(here + "\n")
        return root / "bin" / "python"

    def request(self, variant: Variant, index: int) -> RunRequest:
        install = f"pip install --quiet --no-index --find-links {self.wheels} -e ."
        if not variant.layered:  # today: the shared environment's own pip
            install = (
                f"{self.base} -m pip install --quiet --no-index --find-links {self.wheels} -e ."
            )
        timed = f"t0=$(date +%s%N); {install} && echo $(( $(date +%s%N) - t0 )) > install-ns"
        runtime = Runtime("default", setup=(timed,))
        batch = Batch("b", gpus=0, tests=("tests",), timeout_s=600)
        config = Config(
            version=1,
            batches={"b": batch},
            runtimes={"default": runtime},
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        )
        cache = self.work / "caches" / (variant.name if variant.warm else f"{variant.name}-{index}")
        made = RunRequest(
            run_id=f"bench-{index}",
            batch=batch,
            config=config,
            source=self.project,
            gpu_indices=(),
            work_root=self.work / "runs",
            python=str(self.base),
            load_report_plugin=False,
        )
        if not variant.layered:
            return made
        host = (
            sandbox.SandboxHost(self.bwrap, read_only=(str(self.wheels),))
            if variant.sandboxed
            else None
        )
        return replace(
            made,
            environment=Environment(str(self.base), "bench", self.uv if variant.uv else None),
            sandbox=host,
            caches=CachePlan(cache, "bench/project", trusted=True),
        )

    def measure(self, variant: Variant, index: int) -> tuple[float, float]:
        """(lease -> pytest starts, the install alone) in seconds."""
        leased = time.time()
        outcome = run_batch(self.request(variant, index))
        src = outcome.workdir / "box" / "src"
        marker = src / "pytest-started"
        if not marker.exists():
            raise SystemExit(f"{variant.name}: pytest did not start\n{outcome.log_tail}")
        started = float(marker.read_text())
        install = int((src / "install-ns").read_text()) / 1e9
        shutil.rmtree(outcome.workdir, ignore_errors=True)
        return started - leased, install


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="runs per variant (one warm-up)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuci-bench-env-") as tmp:
        bench = Bench(Path(tmp))
        if not bench.uv or not bench.bwrap:
            raise SystemExit(
                "needs uv (pip install uv) and bubblewrap (apt-get install bubblewrap)"
            )
        print(f"python {sys.version.split()[0]}, uv {_uv_version(bench.uv)}, {_bwrap_version()}")
        print(f"n={args.repeats} per variant; seconds")
        print(f"{'variant':<30} {'lease->pytest p50':>17} {'p90':>6} {'install p50':>12}")
        p50: dict[str, float] = {}
        installs: dict[str, float] = {}
        for variant in VARIANTS:
            if variant.warm:
                bench.measure(variant, -1)  # warm the cache (and, today, the shared env)
            measured = [bench.measure(variant, i) for i in range(args.repeats)]
            times = [m[0] for m in measured]
            p50[variant.name] = statistics.median(times)
            installs[variant.name] = statistics.median(m[1] for m in measured)
            print(
                f"{variant.name:<30} {p50[variant.name]:17.3f} {p(times, 0.9):6.3f} "
                f"{installs[variant.name]:12.3f}"
            )
        today = p50["today: shared environment"]
        sandboxed = p50["sandbox + layered, uv, warm"]
        print(
            f"\nwarm layered + sandbox over today: {sandboxed - today:+.3f} s p50 "
            f"(target at most +1.5 s)"
        )
        uv_install = installs["layered, uv, warm cache"]
        pip_install = installs["layered, pip, warm cache"]
        print(f"warm install, pip / uv: {pip_install / uv_install:.1f}x (target at least 5x)")


def _uv_version(uv: str) -> str:
    return subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.split()[1]


def _bwrap_version() -> str:
    return subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
