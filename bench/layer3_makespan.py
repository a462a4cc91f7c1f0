"""Benchmark: a real project's whole Layer 3 through the real machinery on a simulated 8-GPU host.

Real Redis, a `gpuci worker` process (simulated GPUs, `sim:8xH20-96GB`), the scheduler's
`tick` in this process with source tokens minted by `GitHubApp` against fakehub, real pytest on
fakehub's tarball. Each batch's only test sleeps for the batch's duration, compressed: one
nominal minute lasts SCALE seconds.

1. gpuci: the 15 runs of Layer 3 at the default branch's head, all pending at once; the scheduler
   ticks every TICK_S until every run is completed. Makespan: first start to last finish.
2. One at a time, as a host-wide lock would run them: the same batches through the same worker
   and scheduler, one run created only when the previous one is completed (at a second commit
   with the same files, so this phase fetches its archive once, like the first). The lock's
   makespan is the sum of the batches' wall times; the gaps between runs (scheduler tick, ticket
   pickup) are printed but not counted, since a lock loop has none.

The real scheduler learns each batch's expected duration from the history of its runs
(`runs.record_duration` after every run, the median is planned with); a fresh Redis has none, so
the bench records each batch's nominal scaled duration once beforehand. GitHub's pacing of
writes (1 s between two; minting a source token is one) is compressed like everything else.

Why the baseline creates one run at a time rather than using `gpuci worker --slots 1`: it is
the serial execution of a host-wide lock with no scheduling decisions in it at all.

    .venv/bin/python bench/layer3_makespan.py [--scale 1.0] [--order shared|config|lpt]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from redis import Redis

from bot import hostlink, runs, scheduler
from bot.github_app import GitHubApp
from bot.runs import Run, RunState, RunTrigger
from contract import keys
from contract.config import load_config
from contract.settings import Settings
from fakehub.testing import running
from fakehub.world import build_world

HOST = "bench-h1"
REPO = "acme/gpu-project"
INSTALLATION = 301
GPUS = 8
TICK_S = 0.25
MARK = "LAYER3_BENCH_ID"  # in the worker's environment: every process it starts inherits it
# A real project's Layer 3: batch -> (GPUs, minutes), as in bench/layer3_plan.py.
LAYER3 = {
    "2": (1, 2.5), "3": (1, 5.6), "4a": (1, 1.9), "4b": (1, 5.6), "4c": (1, 5.6),
    "4d": (1, 1.9), "4e": (1, 5.6), "5": (2, 5.6), "6": (4, 3.75), "7": (4, 2.8),
    "8": (4, 15), "9": (4, 7.5), "9q": (4, 15), "10": (8, 29), "11": (2, 9.4),
}  # fmt: skip


@dataclass(frozen=True)
class Span:
    batch: str
    start: float
    end: float
    gpus: tuple[int, ...]
    conclusion: str

    @property
    def wall(self) -> float:
        return self.end - self.start


# --- the tested repository and its GitHub ----------------------------------------------------


def gpuci_yml(scale: float) -> str:
    batches = {}
    for name, (gpus, minutes) in LAYER3.items():
        timeout = int(minutes * scale * 3 + 120)
        batches[name] = {
            "gpus": gpus,
            "tests": [f"tests/test_b{name}.py"],
            "timeout": f"{timeout}s",
        }
    config = {
        "version": 1,
        "pytest_args": ["-q", "-p", "no:cacheprovider"],
        # Plugin autoload off: each pytest starts in a fraction of a second.
        "env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        "layers": {"3": {"batches": "all", "schedule": "0 16 * * 6"}},
        "batches": batches,
    }
    return yaml.safe_dump(config, sort_keys=False)


def repo_files(scale: float) -> dict[str, str]:
    files = {".gpuci.yml": gpuci_yml(scale), "README.md": "Layer 3 benchmark\n"}
    for name, (_, minutes) in LAYER3.items():
        files[f"tests/test_b{name}.py"] = (
            "import time\n\n\n"
            f"def test_batch_{name}():\n"
            f"    time.sleep({minutes * scale:.3f})  # {minutes} min, compressed\n"
        )
    return files


def world_data(files: dict[str, str]) -> dict[str, Any]:
    return {
        "app": {"id": 4444, "slug": "gpuci", "name": "gpuci", "generate": True},
        "installations": [{"id": INSTALLATION, "account": "acme", "repositories": [REPO]}],
        "users": [{"login": "acme", "id": 3000, "type": "Organization"}],
        "repos": [
            {
                "full_name": REPO,
                "default_branch": "main",
                "files": files,
                # Same files, another commit: the one-at-a-time phase fetches its own archive.
                "sources": {"baseline": {"README.md": "Layer 3 benchmark, one at a time\n"}},
            }
        ],
    }


# --- processes --------------------------------------------------------------------------------


@contextmanager
def worker_process(env: dict[str, str], log_path: Path, bench_id: str) -> Iterator[None]:
    """`gpuci worker --host HOST` in its own session; on exit it and everything carrying the
    bench's marker (RQ workers, work horses, pytest) are stopped."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "worker", "--host", HOST],
            env=env,
            cwd=log_path.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield
        finally:
            _stop(proc, bench_id)


def _stop(proc: subprocess.Popen[bytes], bench_id: str) -> None:
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    for pid in marked_pids(bench_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    if proc.poll() is None:
        proc.wait(timeout=5)


def marked_pids(bench_id: str) -> set[int]:
    """Live processes started for this bench (their environment carries its id), never this one."""
    needle = f"{MARK}={bench_id}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def wait_for_host(conn: Redis, proc_log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not conn.exists(keys.host_alive(HOST)):
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker did not register {HOST}:\n{proc_log.read_text()[-3000:]}")
        time.sleep(0.1)


# --- the two phases ---------------------------------------------------------------------------


class Bench:
    def __init__(self, conn: Redis, app: GitHubApp, api_url: str, config_text: str) -> None:
        self.conn, self.app, self.api_url, self.config_text = conn, app, api_url, config_text
        conn.hset(keys.repos(), REPO, str(INSTALLATION))  # as the events process records it

    def source_token(self, run: Run) -> str:
        return self.app.source_token(run.installation_id, run.repo.split("/", 1)[1])

    def create(self, sha: str, batch: str, created_at: float | None = None) -> Run:
        return runs.create_run(
            self.conn,
            repo=REPO,
            installation_id=INSTALLATION,
            pr=0,
            sha=sha,
            batch=batch,
            trigger=RunTrigger.SCHEDULE,
            requested_by="schedule of layer 3",
            config_text=self.config_text,
            trust="trusted",
            created_at=created_at,
        )

    def drive(self, run_ids: Sequence[str], timeout_s: float) -> dict[str, Run]:
        """Scheduling rounds until every run is over (completed or cancelled)."""
        deadline = time.monotonic() + timeout_s
        while True:
            hostlink.drain(self.conn)  # what the host said, as the events process applies it
            done = scheduler.tick(self.conn, self.source_token, self.api_url)
            if done.failed:
                print(f"  scheduler failed runs: {done.failed}", file=sys.stderr)
            found = {r: runs.get_run(self.conn, r) for r in run_ids}
            if all(r is not None and not r.active for r in found.values()):
                return {k: v for k, v in found.items() if v is not None}
            if time.monotonic() > deadline:
                states = {r.batch: str(r.state) for r in found.values() if r is not None}
                raise SystemExit(f"timed out; run states: {states}")
            time.sleep(TICK_S)


def spans(found: dict[str, Run]) -> dict[str, Span]:
    return {
        r.batch: Span(r.batch, r.started_at, r.finished_at, r.gpus, r.conclusion)
        for r in found.values()
    }


def creation_order(config_text: str, order: str) -> list[str]:
    """The layer's batches in the order the runs are written. With `--order shared` (what the
    scheduler's `Schedules` does) they share one created_at and the planner orders them itself,
    largest GPU-minutes first; `config` and `lpt` give each run its own created_at in that
    order (first come, first served)."""
    names = list(load_config(config_text, ".gpuci.yml").layers["3"].batches)
    if order == "lpt":
        names.sort(key=lambda n: -LAYER3[n][0] * LAYER3[n][1])
    return names


# --- report -----------------------------------------------------------------------------------


def report(
    scale: float, order: str, gpuci: dict[str, Span], serial: dict[str, Span] | None
) -> None:
    """`serial` None: the one-at-a-time figure is the sum of the gpuci run's own wall times."""
    gpu_minutes = sum(g * m for g, m in LAYER3.values())
    longest = max(m for _, m in LAYER3.values())
    bound = max(longest, gpu_minutes / GPUS)
    nominal_serial = sum(m for _, m in LAYER3.values())
    t0 = min(s.start for s in gpuci.values())
    makespan = (max(s.end for s in gpuci.values()) - t0) / scale
    measured = serial or gpuci
    lock = sum(s.wall for s in measured.values()) / scale

    print(f"\nSCALE: 1 nominal minute = {scale:g} s; runs created in {order} order")
    print(f"gpuci on {HOST} (8 simulated GPUs), start -> end in nominal minutes:")
    print(
        f"  {'batch':>5} {'GPUs':>4} {'nominal':>8} {'start':>7} {'end':>7} {'wall':>6} {'over':>5}"
    )
    for s in sorted(gpuci.values(), key=lambda s: (s.start, s.batch)):
        gpus, minutes = LAYER3[s.batch]
        print(
            f"  {s.batch:>5} {gpus:>4} {minutes:>8.2f} {(s.start - t0) / scale:>7.1f} "
            f"{(s.end - t0) / scale:>7.1f} {s.wall / scale:>6.2f} {s.wall / scale - minutes:>5.2f}"
            f"  GPUs {','.join(map(str, s.gpus))}"
            + ("" if s.conclusion == "success" else "  " + s.conclusion)
        )
    overhead = [s.wall - LAYER3[s.batch][1] * scale for s in gpuci.values()]
    serial_over = [s.wall - LAYER3[s.batch][1] * scale for s in measured.values()]
    print(
        f"per-batch overhead (wall - nominal): gpuci {sum(overhead) / len(overhead):.2f} s mean, "
        f"one at a time {sum(serial_over) / len(serial_over):.2f} s mean "
        f"(= {sum(serial_over) / len(serial_over) / scale:.2f} nominal min per batch)"
    )
    if serial:
        through = max(s.end for s in serial.values()) - min(s.start for s in serial.values())
        how = f"first start to last finish through the scheduler {through / scale:.1f}"
    else:
        how = "taken from the gpuci run, not measured one at a time"
    print(f"lower bound max(longest {longest:g}, {gpu_minutes:.1f} GPU-min / {GPUS}) = {bound:.1f}")
    print(f"gpuci makespan            {makespan:6.1f} min")
    print(
        f"one at a time (lock)      {lock:6.1f} min  (sum of wall times; {how}; "
        f"nominal {nominal_serial:.1f})"
    )
    print(f"gpuci / lower bound       {makespan / bound:6.3f}  (target <= 1.15)")
    print(f"gpuci / one at a time     {makespan / lock:6.3f}  (target < 0.55)")
    bad = [s.batch for s in [*gpuci.values(), *measured.values()] if s.conclusion != "success"]
    if bad:
        print(f"WARNING: runs not successful: {bad}")


# --- main -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="seconds per nominal minute")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/7", help="flushed!")
    parser.add_argument("--order", choices=("shared", "config", "lpt"), default="shared")
    parser.add_argument("--no-baseline", action="store_true", help="skip the one-at-a-time phase")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    conn = Redis.from_url(args.redis_url)
    conn.ping()
    conn.flushdb()
    bench_id = uuid.uuid4().hex
    try:
        with tempfile.TemporaryDirectory(prefix="gpuci-layer3-") as tmp:
            return run(args, conn, Path(tmp), bench_id)
    except KeyboardInterrupt:
        print("interrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        conn.flushdb()
        conn.close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace, conn: Redis, tmp: Path, bench_id: str) -> int:
    scale: float = args.scale
    files = repo_files(scale)
    world = build_world(world_data(files), base_dir=tmp, key_path=tmp / "app.pem")
    repo = world.repos[REPO]
    head, baseline_sha = repo.branches["main"], repo.branches["baseline"]
    with running(world) as hub:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("GPUCI_", "REDIS_"))},
            "REDIS_URL": args.redis_url,
            "GPUCI_APP_ID": str(world.app.id),
            "GPUCI_PRIVATE_KEY_PATH": str(tmp / "app.pem"),
            "GPUCI_GITHUB_API_URL": hub.url,
            "GPUCI_HOST": HOST,
            "GPUCI_GPU_BACKEND": f"sim:{GPUS}xH20-96GB",
            "GPUCI_WORK_DIR": str(tmp / "work" / "runs"),
            "GPUCI_IDLE_SAMPLE_INTERVAL_S": "0",
            "GPUCI_IDLE_SAMPLES": "1",
            "GPUCI_KILL_GRACE_S": "1",
            MARK: bench_id,
        }
        settings = Settings(
            redis_url=args.redis_url,
            app_id=env["GPUCI_APP_ID"],
            private_key_path=env["GPUCI_PRIVATE_KEY_PATH"],
            github_api_url=hub.url,
            # GitHub's pacing of writes (1 s between two, minting a token is one), compressed.
            github_write_interval_s=scale / 60,
        )
        bench = Bench(conn, GitHubApp.from_settings(settings), hub.url, files[".gpuci.yml"])
        for name, (_, minutes) in LAYER3.items():
            runs.record_duration(conn, REPO, name, minutes * scale)  # what history would hold
        log_path = tmp / "worker.log"
        with worker_process(env, log_path, bench_id):
            try:
                wait_for_host(conn, log_path)
                return phases(args, bench, head, baseline_sha)
            except BaseException:
                cancel_active(conn)
                raise


def phases(args: argparse.Namespace, bench: Bench, head: str, baseline_sha: str) -> int:
    scale: float = args.scale
    nominal_serial = sum(m for _, m in LAYER3.values())
    order = creation_order(bench.config_text, args.order)
    print(f"gpuci: {len(order)} runs of Layer 3 pending at once (about {70 * scale:.0f} s)")
    shared = time.time() if args.order == "shared" else None
    created = [bench.create(head, name, shared) for name in order]
    gpuci = spans(bench.drive([r.run_id for r in created], timeout_s=400 * scale + 120))
    serial: dict[str, Span] | None = None
    if not args.no_baseline:
        print(f"one at a time: the same batches in turn (about {nominal_serial * scale:.0f} s)")
        serial = {}
        for name in LAYER3:
            one = bench.create(baseline_sha, name)
            serial |= spans(bench.drive([one.run_id], timeout_s=60 * scale + 120))
    report(scale, args.order, gpuci, serial)
    return 0


def cancel_active(conn: Redis) -> None:
    """Cancel every active run: the worker kills their batches' processes within a second."""
    active = [r for r in runs.list_runs(conn, limit=1000) if r.active]
    for run in active:
        runs.update_run(conn, run, state=RunState.CANCELLED, wait_reason="benchmark interrupted")
        hostlink.cancel(conn, run)
    if any(r.state in runs.DISPATCHED for r in active):
        time.sleep(2.5)


if __name__ == "__main__":
    sys.exit(main())
