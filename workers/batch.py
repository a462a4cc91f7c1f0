"""One batch on this host, as a worker runs it: pick idle GPUs, lease, run, summarize, release."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import Redis

from contract import leases
from contract.checks import CheckOutput, Conclusion, Verdict, judge
from contract.config import Batch, Config, HostGpu, gpu_matches
from contract.results import GpuInfo, RunReport, Summary
from contract.settings import Settings
from workers.gpus import GpuBackend, GpuState, gpu_states, open_backend
from workers.hostsetup import HostSetup, HostSetupError, RuntimeUnavailable
from workers.junit import JUnitError, parse_junit, parse_report
from workers.outcomes import read_outcomes
from workers.runner import RunOutcome, RunRequest, resolve_workers, run_batch

Progress = Callable[[str], None]
# pytest's exit codes that mean the run itself went wrong, whatever the JUnit file says.
PYTEST_TROUBLE = {
    2: "was interrupted",
    3: "hit an internal error",
    4: "was given a bad command line (see the log)",
}


class BatchError(Exception):
    """The batch cannot start here; the message says why and what to do."""


@dataclass
class BatchResult:
    """A batch that ran here: what its host reports (`report`), judged (`verdict`)."""

    batch: str
    sha: str
    host: str
    report: RunReport
    verdict: Verdict
    outcome: RunOutcome

    @property
    def conclusion(self) -> Conclusion:
        return self.verdict.conclusion

    @property
    def title(self) -> str:
        return self.verdict.title

    @property
    def output(self) -> CheckOutput:
        return self.verdict.output

    @property
    def summary(self) -> Summary:
        return self.report.summary

    def to_json(self) -> dict[str, Any]:
        data = dict(self.verdict.data)
        data.update(log_path=str(self.outcome.log_path), junit_path=str(self.outcome.junit_path))
        return data


def host_gpu(gpu: GpuInfo) -> HostGpu:
    """The inventory view of a probed GPU, for matching a batch's constraints."""
    major, _, minor = gpu.compute_capability.partition(".")
    cc = (int(major), int(minor or 0)) if major.isdigit() and (minor or "0").isdigit() else (0, 0)
    return HostGpu(name=gpu.name, memory_mb=gpu.memory_total_mb or 0, compute_capability=cc)


def select_gpus(states: Sequence[GpuState], batch: Batch) -> list[GpuState] | None:
    """The first `batch.gpus` idle GPUs that satisfy the batch's constraints, or None."""
    fitting = [s for s in states if s.idle and gpu_matches(batch, host_gpu(s.gpu))]
    return fitting[: batch.gpus] if len(fitting) >= batch.gpus else None


def explain_no_fit(states: Sequence[GpuState], batch: Batch) -> str:
    """Why this host cannot start the batch now, GPU by GPU."""
    idle = sum(1 for s in states if s.idle and gpu_matches(batch, host_gpu(s.gpu)))
    lines = [f"batch {batch.name} needs {batch.gpus} idle GPUs; {idle} fit on this host:"]
    for s in states:
        if not gpu_matches(batch, host_gpu(s.gpu)):
            verdict = "does not meet the batch's constraints"
        else:
            verdict = "idle" if s.idle else "; ".join(s.reasons)
        lines.append(f"  GPU {s.gpu.index} ({s.gpu.name}): {verdict}")
    return "\n".join(lines)


def source_sha(source: Path) -> str:
    """HEAD of a git checkout, or "" when the source is not one."""
    try:
        out = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def run_on_host(
    *,
    settings: Settings,
    config: Config,
    batch_name: str,
    source: Path,
    sha: str = "",
    connect: Callable[[], Redis] | None = None,
    progress: Progress = lambda _msg: None,
) -> BatchResult:
    """Run `batch_name` from `source` on this host's GPUs, leased in Redis for the run."""
    batch = _batch(config, batch_name)
    run_id = f"local-{uuid.uuid4().hex[:12]}"
    parts = _request_parts(settings, config, batch, source, progress)
    if batch.gpus == 0:
        progress(f"batch {batch.name}: CPU only, no GPUs needed")
        request = run_request(
            settings, config, batch, source=source, run_id=run_id, gpu_indices=(), gpus=(),
            simulated=True, parts=parts,
        )  # fmt: skip
        return conclude_run(settings, batch, sha, [], run_batch(request))
    backend = open_backend(settings.gpu_backend)
    conn = (connect or (lambda: Redis.from_url(settings.redis_url)))()
    return _run_leased(settings, config, batch, source, sha, run_id, backend, conn, progress, parts)


def _request_parts(
    settings: Settings, config: Config, batch: Batch, source: Path, progress: Progress
) -> dict[str, Any]:
    """The environment, sandbox and caches this host gives the batch (as a worker would)."""
    try:
        setup = HostSetup.from_settings(settings)
        for warning in setup.warnings:
            progress(f"WARNING: {warning}")
        return setup.request_parts(config.runtime_for(batch), f"local/{source.name}", True)
    except (HostSetupError, RuntimeUnavailable) as exc:
        raise BatchError(str(exc)) from None


def _batch(config: Config, name: str) -> Batch:
    if name not in config.batches:
        valid = ", ".join(config.batches) or "(none)"
        raise BatchError(f"unknown batch {name!r}; batches in this config: {valid}")
    return config.batches[name]


def _run_leased(
    settings: Settings,
    config: Config,
    batch: Batch,
    source: Path,
    sha: str,
    run_id: str,
    backend: GpuBackend,
    conn: Redis,
    progress: Progress,
    parts: dict[str, Any],
) -> BatchResult:
    chosen = _lease(settings, batch, backend, conn, run_id, progress)
    indices = tuple(s.gpu.index for s in chosen)
    owner = chosen_owner = _owner_of(conn, settings.host, indices)
    heartbeat = leases.LeaseHeartbeat(conn, settings.host, indices, owner, settings.lease_ttl_s)
    try:
        with heartbeat:
            progress(f"batch {batch.name}: running on GPUs {list(indices)} of {settings.host}")
            request = run_request(
                settings, config, batch, source=source, run_id=run_id, gpu_indices=indices,
                gpus=[state.gpu for state in chosen], simulated=backend.simulated, parts=parts,
            )  # fmt: skip
            outcome = run_batch(request, gpu_pids=lambda: _pids_on(backend, indices))
            _wait_until_free(backend, indices, settings.kill_grace_s)
    finally:
        leases.release(conn, settings.host, indices, chosen_owner)
    return conclude_run(settings, batch, sha, [s.gpu for s in chosen], outcome)


def _lease(
    settings: Settings,
    batch: Batch,
    backend: GpuBackend,
    conn: Redis,
    run_id: str,
    progress: Progress,
) -> list[GpuState]:
    """Lease fitting idle GPUs, then re-check them under the lease (fail closed)."""
    owner = f"{run_id}:{uuid.uuid4().hex}"
    for _attempt in range(3):
        states = _states(settings, backend, conn)
        chosen = select_gpus(states, batch)
        if chosen is None:
            raise BatchError(explain_no_fit(states, batch))
        indices = [s.gpu.index for s in chosen]
        if not leases.acquire(conn, settings.host, indices, owner, settings.lease_ttl_s):
            continue  # another run took one of them between probe and lease: look again
        recheck = {s.gpu.index: s for s in _states(settings, backend, conn, owner)}
        if all(recheck[i].idle for i in indices):
            progress(f"batch {batch.name}: leased GPUs {indices} on {settings.host}")
            return chosen
        leases.release(conn, settings.host, indices, owner)
    raise BatchError(f"batch {batch.name}: GPUs kept getting busy while leasing; try again")


def _states(
    settings: Settings, backend: GpuBackend, conn: Redis, own: str | None = None
) -> list[GpuState]:
    indices = [g.index for g in backend.snapshot()]
    held = leases.holders(conn, settings.host, indices)
    leased = {i: who for i, who in held.items() if who is not None and who != own}
    return gpu_states(
        backend,
        leased,
        samples=settings.idle_samples,
        interval_s=settings.idle_sample_interval_s,
        idle_memory_mb=settings.idle_memory_mb,
    )


def _owner_of(conn: Redis, host: str, indices: Sequence[int]) -> str:
    owners = {who for who in leases.holders(conn, host, indices).values() if who}
    if len(owners) != 1:
        raise BatchError(f"lost the lease on GPUs {list(indices)} before the run started")
    return owners.pop()


def _pids_on(backend: GpuBackend, indices: Sequence[int]) -> set[int]:
    if backend.simulated:
        return set()  # simulated processes are foreign by definition; never signal them
    return {p.pid for g in backend.snapshot() if g.index in indices for p in g.processes}


def _wait_until_free(backend: GpuBackend, indices: Sequence[int], grace_s: float) -> None:
    """Hold the lease until no compute process remains on the run's GPUs (or grace passes)."""
    deadline = time.monotonic() + grace_s
    while _pids_on(backend, indices) and time.monotonic() < deadline:
        time.sleep(0.5)


def run_request(
    settings: Settings,
    config: Config,
    batch: Batch,
    *,
    source: Path,
    run_id: str,
    gpu_indices: tuple[int, ...],
    gpus: Sequence[GpuInfo],
    simulated: bool,
    parts: dict[str, Any],
) -> RunRequest:
    """The run as this host starts it, the same for a worker's ticket and `gpuci run-batch`:
    its xdist workers from the batch and its GPUs' free memory, its device nodes, its limits."""
    free = [max(0, (g.memory_total_mb or 0) - (g.memory_used_mb or 0)) for g in gpus]
    return RunRequest(
        run_id=run_id,
        batch=batch,
        config=config,
        source=source,
        gpu_indices=gpu_indices,
        work_root=Path(settings.work_dir),
        simulated_gpus=simulated,
        workers=resolve_workers(batch, free),
        kill_grace_s=settings.kill_grace_s,
        log_max_bytes=settings.log_max_bytes,
        run_as=settings.run_as,
        gpu_minors=tuple(g.minor_number for g in gpus if g.minor_number is not None),
        gpu_uuids=tuple(g.uuid for g in gpus),
        fault_at=settings.test_fault,
        **parts,
    )


def conclude_run(
    settings: Settings, batch: Batch, sha: str, gpus: list[GpuInfo], outcome: RunOutcome
) -> BatchResult:
    """The run's report (counts from its JUnit files, how it ended), judged as the bot would."""
    report = report_of(outcome, gpus)
    verdict = judge(
        report,
        batch=batch.name,
        allow_no_tests=batch.allow_no_tests,
        sha=sha,
        host=settings.host,
    )
    return BatchResult(batch.name, sha, settings.host, report, verdict, outcome)


def report_of(outcome: RunOutcome, gpus: Sequence[GpuInfo]) -> RunReport:
    """What the host reports of a run that ended: its summary, how it ended, where it ran."""
    summary, error = _summarize(outcome)
    killed = len(outcome.killed_pids)
    return RunReport(
        summary=summary,
        timed_out=outcome.timed_out,
        cancelled=outcome.cancelled,
        error=error,
        gpus=list(gpus),
        runtime=dict(outcome.runtime),
        log_tail=outcome.log_tail,
        notes=[f"{killed} stray processes killed after the run"] if killed else [],
        duration_s=outcome.duration_s,
        tests=read_outcomes(outcome.report_path) if error is None else [],
    )


def _summarize(outcome: RunOutcome) -> tuple[Summary, str | None]:
    """Counts from the JUnit file, and the infrastructure error if the run never got that far.

    A pytest that never wrote its JUnit file (stopped at its deadline, cancelled, exited
    without finishing) still leaves the gpuci report of every test that completed: the counts,
    failures and the tests that were running come from it.
    """
    if outcome.setup_failed:
        return Summary(), f"runtime.setup failed (exit {outcome.exit_code})"
    if outcome.preflight_error:
        return Summary(), outcome.preflight_error
    junit, report = _existing(outcome.junit_path), _existing(outcome.report_path)
    stopped = outcome.timed_out or outcome.cancelled
    if junit is None:
        summary, unreadable = _from_report(report)
        summary.duration_s = outcome.duration_s  # pytest's own time was never written
        if stopped or outcome.exit_code == 5:
            return summary, unreadable
        if outcome.exit_code in PYTEST_TROUBLE:
            return summary, f"pytest {PYTEST_TROUBLE[outcome.exit_code]} (exit {outcome.exit_code})"
        return summary, f"pytest exited with code {outcome.exit_code} and wrote no JUnit report"
    try:
        summary = parse_junit([junit], report)
    except JUnitError as exc:
        return Summary(), f"unreadable JUnit report: {exc}"
    trouble = PYTEST_TROUBLE.get(outcome.exit_code or 0)
    if trouble and not stopped and not (outcome.exit_code == 2 and summary.errors):
        # exit 2 with errors is pytest stopping at collection errors: they are the result
        return summary, f"pytest {trouble} (exit {outcome.exit_code})"
    return summary, None


def _existing(path: Path | None) -> Path | None:
    return path if path is not None and path.is_file() else None


def _from_report(report: Path | None) -> tuple[Summary, str | None]:
    if report is None:
        return Summary(), None
    try:
        return parse_report(report), None
    except JUnitError as exc:
        return Summary(), f"unreadable gpuci report: {exc}"
