"""Running one batch: fresh directory, sources, setup, GPU preflight, pytest, process cleanup."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import select
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from contract.config import Batch, Config, Runtime
from contract.redact import has_credentials
from workers import cleanup, containers, faults, procs, sandbox
from workers.archive import ArchiveError, extract_archive
from workers.caches import CachePlan, CacheUse, prepare_caches
from workers.envs import EnvError, Layer, PythonLayout, inspect_python
from workers.results import ResultFileError, copy_result, read_result

PLUGIN_DIR = Path(__file__).resolve().parent / "pytest_plugin"
LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_TAIL_LINES = 80
_READ_CHUNK = 64 * 1024
_POLL_S = 0.05
_DRAIN_S = 2.0
IMAGE_PYTHON = "python"  # what runs pytest in a container: the image's own
NOBODY = 65534  # a container's user when the worker is root and GPUCI_RUN_AS is unset
RESULT_MAX_BYTES = 1024 * 1024 * 1024  # a JUnit or report file the run wrote, copied at most

GpuPids = Callable[[], Iterable[int]]


class RunnerError(Exception):
    """The host is misconfigured for running batches (not a problem of the tested code)."""


@dataclass(frozen=True)
class RunRequest:
    run_id: str
    batch: Batch
    config: Config
    source: Path  # a directory to copy, or a tar archive to extract
    gpu_indices: tuple[int, ...]
    work_root: Path
    simulated_gpus: bool = False  # True: no preflight (the GPUs are not real)
    python: str = sys.executable
    workers: int | None = None  # the resolved `-n` (see resolve_workers)
    timeout_s: int | None = None  # one deadline for setup + preflight + pytest; batch's if None
    kill_grace_s: float = 10.0
    log_max_bytes: int = LOG_MAX_BYTES
    run_as: str = ""  # run children as this user (the worker must be root)
    environ: Mapping[str, str] | None = None  # base environment, os.environ if None
    load_report_plugin: bool = True
    # A fresh virtual environment layered on this base for the run; None: `python` itself.
    environment: Environment | None = None
    sandbox: sandbox.SandboxHost | None = None  # None: no sandbox (an explicit host setting)
    caches: CachePlan | None = None  # the runtime's caches; None: none
    gpu_minors: tuple[int, ...] = ()  # /dev/nvidia<minor> of gpu_indices (sandbox only)
    gpu_uuids: tuple[str, ...] = ()  # real GPUs' UUIDs: CUDA_VISIBLE_DEVICES names these
    container: containers.ContainerHost | None = None  # the engine, for `image:` runtimes
    fault_at: str = ""  # tests only (GPUCI_TEST_FAULT): raise at this step (workers/faults.py)

    @property
    def runtime(self) -> Runtime:
        return self.config.runtime_for(self.batch)


@dataclass(frozen=True)
class Environment:
    """The base a run's environment is layered on, and the installer its `pip` uses."""

    base_python: str
    base_name: str = "default"
    uv: str | None = None


@dataclass
class RunOutcome:
    exit_code: int | None  # pytest's exit status; None when pytest did not finish by itself
    timed_out: bool
    cancelled: bool
    setup_failed: bool  # sources, a setup command or starting a process failed
    preflight_error: str | None
    junit_path: Path | None  # None when pytest wrote none
    report_path: Path | None
    log_path: Path
    log_tail: str
    log_truncated: bool
    duration_s: float
    workdir: Path
    killed_pids: list[int] = field(default_factory=list)
    # What the run saw: profile, base or image, python, torch, cuda, installer, sandbox, network.
    runtime: dict[str, str] = field(default_factory=dict)


def resolve_workers(batch: Batch, free_vram_mb: Sequence[int]) -> int | None:
    """The `-n` for pytest-xdist: None (no xdist), the batch's number, or derived from VRAM.

    "auto" fits as many workers as each leased GPU's free memory holds, summed over the GPUs:
    `max(1, sum(free // vram_per_worker_mb))`. Without `vram_per_worker_mb`, one per GPU.
    """
    if batch.workers is None or isinstance(batch.workers, int):
        return batch.workers
    if not batch.vram_per_worker_mb:
        return max(1, len(free_vram_mb))
    return max(1, sum(max(0, free) // batch.vram_per_worker_mb for free in free_vram_mb))


def build_pytest_command(
    python: str,
    config: Config,
    batch: Batch,
    *,
    workers: int | None,
    junit_path: Path,
    report_path: Path | None,
) -> list[str]:
    """The pytest command line; `report_path` None leaves out the gpuci_report plugin."""
    command = [python, "-m", "pytest", *config.pytest_args, *batch.pytest_args]
    if batch.markers:
        command += ["-m", batch.markers]
    if workers:
        command += ["-n", str(workers)]
    command += [f"--junitxml={junit_path}", "-o", "junit_family=xunit1"]
    if report_path is not None:
        command += ["-p", "gpuci_report", f"--gpuci-report={report_path}"]
    return [*command, *batch.tests]


# One table for what never reaches tested code: name prefixes, name fragments, name suffixes.
_SECRET_PREFIXES = ("GPUCI_", "REDIS_", "GITHUB_", "GH_", "AWS_", "AZURE_", "GOOGLE_", "GCP_")
_SECRET_PARTS = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "APIKEY", "API_KEY", "PRIVATE", "AUTH",
    "COOKIE", "SIGNING",
)  # fmt: skip
_SECRET_SUFFIXES = ("_KEY", "_PASS", "_PWD", "_DSN")
# The worker's own pytest and coverage settings would leak into the tested run.
_HOST_ONLY_PREFIXES = ("PYTEST_", "COV_CORE_")
_GITHUB_TOKEN = re.compile(r"^(gh[pousr]_|github_pat_)[A-Za-z0-9_]{20,}")


def is_secret(name: str, value: str) -> bool:
    """True for variables a test process must not see: credentials and worker-only settings.
    A value counts as a credential when it looks like a GitHub token or holds a URL (or a
    query) with a credential in it: userinfo (`redis://:pw@host`, `https://key@host`) or a
    secret-named parameter (`?token=`, `&password=`), as `contract.redact` parses them."""
    upper = name.upper()
    return (
        upper.startswith(_SECRET_PREFIXES + _HOST_ONLY_PREFIXES)
        or any(part in upper for part in _SECRET_PARTS)
        or upper.endswith(_SECRET_SUFFIXES)
        or bool(_GITHUB_TOKEN.search(value))
        or has_credentials(value)
    )


def test_environment(
    base: Mapping[str, str],
    *,
    config: Config,
    batch: Batch,
    gpu_indices: Sequence[int],
    token: str,
    plugin_dir: Path | None,
    tmpdir: Path | None = None,
    runtime_env: Mapping[str, str] | None = None,
    visible_devices: Sequence[str] | None = None,
) -> dict[str, str]:
    """The scrubbed environment of a run's processes.

    The base loses credentials; config.env, the runtime's env, then batch.env apply; the leased
    GPUs (NVML's PCI bus order, or their UUIDs), the run marker and TMPDIR are set last so the
    config cannot override them.
    """
    env = {name: value for name, value in base.items() if not is_secret(name, value)}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(config.env)
    env.update(runtime_env or {})
    env.update(batch.env)
    if plugin_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_dir), env.get("PYTHONPATH")]))
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    devices = visible_devices if visible_devices else [str(index) for index in gpu_indices]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    env[procs.RUN_MARKER_VAR] = token
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return env


test_environment.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def run_batch(
    req: RunRequest,
    cancel: threading.Event | None = None,
    gpu_pids: GpuPids | None = None,
) -> RunOutcome:
    """Run one batch to the end, a timeout or `cancel`; no process of the run survives it.

    `gpu_pids` lists compute processes on the leased GPUs; they are killed with the run on a
    timeout or cancel. Raises RunnerError only for a host misconfiguration (unknown run_as user).
    """
    user = _run_as_user(req.run_as)
    run = _Run(req, user, cancel or threading.Event(), gpu_pids or tuple)
    with cleanup.in_use(run.workdir):
        try:
            ending = run.steps()
        finally:
            run.remove_container()
            run.sweep()
            run.log.close()
        return run.outcome(ending)


@dataclass(frozen=True)
class _User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def _run_as_user(name: str) -> _User | None:
    if not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise RunnerError(f"run_as user {name!r} does not exist on this host") from None
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return _User(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


@dataclass
class _Step:
    """How one child process ended."""

    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    start_error: str | None = None

    @property
    def interrupted(self) -> bool:
        return self.timed_out or self.cancelled


@dataclass(frozen=True)
class _Ending:
    """How the run as a whole ended: the outcome's fields decided by the steps."""

    exit_code: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    setup_failed: bool = False
    preflight_error: str | None = None

    @classmethod
    def interrupted(cls, step: _Step) -> _Ending:
        return cls(timed_out=step.timed_out, cancelled=step.cancelled)


class _Run:
    """One batch's directories, log, environment, sandbox and deadline, and its steps.

    The run directory (`<run_id>-<random>`) stays the worker's: it holds the log and the
    copies of the results the worker reads. The run's processes get only `box/` in it: the
    sources (`src`), HOME, TMPDIR, the layered environment (`env`) and what pytest writes
    (`out`); with a sandbox they see nothing else of the host that is not read-only.
    """

    def __init__(
        self, req: RunRequest, user: _User | None, cancel: threading.Event, gpu_pids: GpuPids
    ):
        self.req, self.user, self.cancel, self.gpu_pids = req, user, cancel, gpu_pids
        self.started = time.monotonic()
        self.deadline = self.started + (req.timeout_s or req.batch.timeout_s)
        self.token = secrets.token_hex(16)
        self.runtime = req.runtime
        self.workdir = _fresh_workdir(req.work_root, req.run_id)
        self.box = self.workdir / "box"
        for name in ("", "src", "home", "tmp", "out"):
            (self.box / name).mkdir(mode=0o700, exist_ok=True)
        self.log = CappedLog(self.workdir / "output.log", req.log_max_bytes)
        self.killed: set[int] = set()
        self.layer: Layer | None = None
        self.python = req.python
        self.caches: CacheUse | None = None
        self.seen: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.container: containers.ContainerRun | None = None

    # --- the steps ---

    def steps(self) -> _Ending:
        """Sources, environment, setup, preflight, pytest: how the run ended, decided by the
        last step taken."""
        problem = self._prepare()
        if problem:
            self.log.note(problem)
            return _Ending(setup_failed=True)
        src = self.box / "src"
        faults.inject(self.req.fault_at, "setup")
        if self.container is not None:
            step = self._start_container()
            if step.interrupted or step.exit_code != 0:
                return _Ending.interrupted(step) if step.interrupted else _Ending(setup_failed=True)
        if self.layer is not None:
            base, installer = self.layer.base.python, self.layer.installer
            label = f"environment: fresh layer on base {base} ({installer})"
            step = self.child(self.layer.create_command(), self.box, label)
            if step.interrupted or step.exit_code != 0:
                return _Ending.interrupted(step) if step.interrupted else _Ending(setup_failed=True)
        for command in self.runtime.setup:
            step = self.child(["bash", "-c", command], src, f"setup: {command}")
            if step.interrupted:
                return _Ending.interrupted(step)
            if step.exit_code != 0:
                return _Ending(setup_failed=True)
        faults.inject(self.req.fault_at, "preflight")
        if self._needs_preflight():
            error, step = self._preflight(src)
            if step.interrupted:
                return _Ending.interrupted(step)
            if error:
                return _Ending(preflight_error=error)
        faults.inject(self.req.fault_at, "pytest")
        step = self.child(self._pytest_command(), src, "pytest")
        if step.interrupted:
            return _Ending.interrupted(step)
        return _Ending(exit_code=step.exit_code, setup_failed=step.start_error is not None)

    def _prepare(self) -> str | None:
        """Sources, environment plan, caches and the process environment; a problem, or None."""
        req = self.req
        if self.runtime.network == "none" and req.sandbox is None:
            return (
                "network: none needs the sandbox, and this host runs without one "
                "(GPUCI_SANDBOX=none); nothing was run"
            )
        if self.runtime.image and req.container is None:
            return f"runtime {self.runtime.describe()} needs a container engine; this host has none"
        real_gpus = req.batch.gpus > 0 and not req.simulated_gpus
        if req.sandbox is not None and real_gpus and len(req.gpu_minors) != len(req.gpu_indices):
            return "the device nodes of the leased GPUs are unknown; nothing was run"
        try:
            base = self._base_layout()
        except EnvError as exc:
            return f"cannot prepare the environment: {exc}"
        problem = self._sources()
        if problem:
            return problem
        if req.caches is not None:
            try:
                self.caches = prepare_caches(req.caches, self.runtime, self.box / "caches")
            except OSError as exc:
                return f"cannot prepare the caches: {exc}"
        if self.runtime.image:
            self.container = self._container()
            self.python = IMAGE_PYTHON
        if self.user:
            _chown_tree(self.box, self.user)
            for path in self.caches.writable if self.caches else ():
                if path.stat().st_uid != self.user.uid:  # new, or first used by this user
                    _chown_tree(path, self.user)
        self.env = self._environment()
        self._record_runtime(base)
        return None

    def _base_layout(self) -> PythonLayout | None:
        """The base interpreter's layout: needed to layer on it, or to show it in a sandbox."""
        env = self.req.environment
        if self.runtime.image or (env is None and self.req.sandbox is None):
            return None
        base = inspect_python(env.base_python if env else self.req.python)
        if env is not None:
            self.layer = Layer(self.box / "env", base, env.uv)
            self.python = self.layer.python
        return base

    def _sources(self) -> str | None:
        source, dest = self.req.source, self.box / "src"
        faults.inject(self.req.fault_at, "sources")
        try:
            if source.is_dir():
                dest.rmdir()
                shutil.copytree(source, dest, symlinks=True, ignore=_IGNORED_SOURCES)
            else:
                extracted = extract_archive(source, self.box / "unpacked")
                dest.rmdir()
                extracted.rename(dest)
        except (ArchiveError, OSError) as exc:
            return f"cannot prepare sources from {source.name}: {exc}"
        return None

    def _environment(self) -> dict[str, str]:
        req = self.req
        runtime_env = dict(self.runtime.env)
        if self.caches:
            runtime_env.update(self.caches.env)
        env = test_environment(
            os.environ if req.environ is None else req.environ,
            config=req.config,
            batch=req.batch,
            gpu_indices=req.gpu_indices,
            token=self.token,
            plugin_dir=PLUGIN_DIR if req.load_report_plugin else None,
            tmpdir=self.box / "tmp",
            runtime_env=runtime_env,
            visible_devices=None if req.simulated_gpus else req.gpu_uuids,
        )
        env["HOME"] = str(self.box / "home")
        if self.user:
            env.update(USER=self.user.name, LOGNAME=self.user.name)
        if self.layer is not None:
            env.update(self.layer.environ(env.get("PATH", os.defpath)))
        return env

    def _record_runtime(self, base: PythonLayout | None) -> None:
        env, engine = self.req.environment, self.req.container
        where = {"image": self.runtime.image or ""} if self.runtime.image else {
            "base": env.base_name if env else "(the worker's Python)",
            "installer": self.layer.installer if self.layer else "(shared environment)",
        }  # fmt: skip
        self.seen = {
            "profile": self.runtime.name,
            **where,
            **({"python": base.version} if base else {}),
            "sandbox": engine.engine
            if self.container and engine
            else ("bubblewrap" if self.req.sandbox else "none"),
            "network": self.runtime.network,
        }

    def _container(self) -> containers.ContainerRun:
        """The run's container: as the run's user (never root), its box and caches mounted."""
        uid, gid = (self.user.uid, self.user.gid) if self.user else (os.getuid(), os.getgid())
        if uid == 0:
            uid = gid = NOBODY
            os.chown(self.box, uid, gid)
            self.user = _User("nobody", uid, gid, (gid,), str(self.box / "home"))
        caches = self.caches
        return containers.ContainerRun(
            name=f"gpuci-{self.workdir.name}",
            image=self.runtime.image or "",
            box=self.box,
            user=f"{uid}:{gid}",
            gpu_indices=() if self.req.simulated_gpus else self.req.gpu_indices,
            writable=caches.writable if caches else (),
            read_only=(*(caches.read_only if caches else ()), PLUGIN_DIR),
            network=self.runtime.network != "none",
        )

    def _start_container(self) -> _Step:
        engine, run = self.req.container, self.container
        assert engine is not None and run is not None
        try:
            self.seen["digest"] = containers.image_digest(engine, run.image)
        except containers.ContainerError as exc:
            self.log.note(str(exc))
            return _Step(exit_code=None, start_error=str(exc))
        label = f"environment: container of {run.image} ({engine.engine})"
        return self.child(containers.start_command(engine, run), self.box, label, raw=True)

    def remove_container(self) -> None:
        """The container goes with every process in it, however the run ended."""
        if self.container is not None and self.req.container is not None:
            command = containers.remove_command(self.req.container, self.container)
            subprocess.run(command, capture_output=True, timeout=120, check=False)

    def _needs_preflight(self) -> bool:
        gpus_to_count = self.req.batch.gpus > 0 and not self.req.simulated_gpus
        return gpus_to_count or self.layer is not None or bool(self.runtime.expect)

    def _preflight(self, src: Path) -> tuple[str | None, _Step]:
        """Versions the run sees (and, for real GPUs, the CUDA devices), checked against the
        runtime's `expect` and the batch's GPU count."""
        out = self.box / "out" / "preflight.json"
        out.unlink(missing_ok=True)  # a setup command must not be able to answer for it
        count = "1" if self.req.batch.gpus > 0 and not self.req.simulated_gpus else "0"
        step = self.child([self.python, "-c", _PREFLIGHT, str(out), count], src, "preflight")
        if step.interrupted:
            return None, step
        seen = _read_preflight(self.box / "out", "preflight.json")
        self.seen.update({k: str(v) for k, v in seen.items() if k in ("python", "torch", "cuda")})
        error = _expect_problem(self.runtime, seen) or self._device_problem(seen, count == "1")
        if error:
            self.log.note(f"preflight failed: {error}; pytest not run")
        return error, step

    def _device_problem(self, seen: Mapping[str, object], counted: bool) -> str | None:
        devices = seen.get("devices")
        found = devices if isinstance(devices, int) else 0
        needed = self.req.batch.gpus
        if not counted or found == needed:
            return None
        return f"tests would see {found} GPUs, batch {self.req.batch.name} needs {needed}"

    def _pytest_command(self) -> list[str]:
        req = self.req
        out = self.box / "out"
        return build_pytest_command(
            self.python,
            req.config,
            req.batch,
            workers=req.workers,
            junit_path=out / "junit.xml",
            report_path=out / "report.jsonl" if req.load_report_plugin else None,
        )

    # --- processes ---

    def child(self, argv: list[str], cwd: Path, label: str, *, raw: bool = False) -> _Step:
        """Run one process (in the run's container or sandbox, if any; `raw`: as it is) in a
        new session, its output to the log, until exit or interruption."""
        if self.cancel.is_set() or time.monotonic() >= self.deadline:
            self.log.note(f"not starting {label}: {self._why_stopped()}")
            return _Step(None, timed_out=not self.cancel.is_set(), cancelled=self.cancel.is_set())
        self.log.note(f"$ {label}")
        if raw:
            pass
        elif self.container is not None and self.req.container is not None:
            argv = containers.exec_command(self.req.container, self.container, argv, cwd, self.env)
            cwd = self.box
        elif self.req.sandbox is not None:
            argv = sandbox.command(self.req.sandbox, self._box(), argv, cwd)
            cwd = Path("/")
        user = None if self.container else self.user  # the engine runs the container's user
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                user=user.uid if user else None, group=user.gid if user else None,
                extra_groups=user.groups if user else None,
            )  # fmt: skip
        except OSError as exc:
            self.log.note(f"cannot start {argv[0]}: {exc}")
            return _Step(exit_code=None, start_error=str(exc))
        assert proc.stdout is not None
        reader = _LogPump(proc.stdout, self.log)
        step = self._wait(proc)
        reader.finish()
        if not step.interrupted and step.exit_code:
            self.log.note(f"{label} exited with status {step.exit_code}")
        return step

    def _box(self) -> sandbox.Box:
        layout = (
            self.layer.visible_paths()
            if self.layer
            else inspect_python(self.python).visible_paths()
        )
        caches = self.caches
        return sandbox.Box(
            box=self.box,
            read_only=(*layout, PLUGIN_DIR),
            writable=caches.writable if caches else (),
            read_only_caches=caches.read_only if caches else (),
            gpu_minors=() if self.req.simulated_gpus else self.req.gpu_minors,
            network=self.runtime.network != "none",
        )

    def _wait(self, proc: subprocess.Popen[bytes]) -> _Step:
        while True:
            try:
                return _Step(exit_code=proc.wait(timeout=_POLL_S))
            except subprocess.TimeoutExpired:
                pass
            if self.cancel.is_set() or time.monotonic() >= self.deadline:
                return self._stop(proc, cancelled=self.cancel.is_set())

    def _stop(self, proc: subprocess.Popen[bytes], *, cancelled: bool) -> _Step:
        grace = self.req.kill_grace_s
        self.log.note(f"{self._why_stopped()}: stopping the run's processes (grace {grace}s)")
        if self.container is not None and self.req.container is not None:
            stop = [
                self.req.container.engine,
                "stop",
                "--time",
                str(int(grace)),
                self.container.name,
            ]
            subprocess.run(stop, capture_output=True, timeout=grace + 60, check=False)
        # bwrap is spared SIGTERM: its exit would end the sandbox before the grace period.
        sandboxed = self.req.sandbox is not None and self.container is None
        spare = procs.children(proc.pid) | {proc.pid} if sandboxed else set()
        killed = procs.terminate_run(
            proc.pid, self.token, grace, extra_pids=self._gpu_pids(), spare=spare
        )
        self._record_killed(killed)
        return _Step(exit_code=proc.wait(), timed_out=not cancelled, cancelled=cancelled)

    def _why_stopped(self) -> str:
        if self.cancel.is_set():
            return "cancelled"
        return f"timed out after {self.req.timeout_s or self.req.batch.timeout_s}s"

    def _gpu_pids(self) -> list[int]:
        try:
            return list(self.gpu_pids())
        except Exception as exc:  # an NVML failure must not leave the run's processes alive
            self.log.note(f"cannot list processes on the run's GPUs: {exc}")
            return []

    def sweep(self) -> None:
        """Kill stray processes of the run (daemons that outlived their parent)."""
        self._record_killed(procs.kill_marked(self.token))

    def _record_killed(self, pids: list[int]) -> None:
        if pids:
            self.log.note(f"killed leftover processes: {' '.join(map(str, pids))}")
        self.killed.update(pids)

    # --- the outcome ---

    def outcome(self, ending: _Ending) -> RunOutcome:
        """The outcome, with the run's JUnit and report copied where its processes cannot
        reach (read without following links, regular files only, size-capped)."""
        junit = self._take_result("junit.xml")
        report = self._take_result("report.jsonl")
        return RunOutcome(
            exit_code=ending.exit_code,
            timed_out=ending.timed_out,
            cancelled=ending.cancelled,
            setup_failed=ending.setup_failed,
            preflight_error=ending.preflight_error,
            junit_path=junit,
            report_path=report,
            log_path=self.log.path,
            log_tail=self.log.tail_text(LOG_TAIL_LINES),
            log_truncated=self.log.truncated,
            duration_s=round(time.monotonic() - self.started, 3),
            workdir=self.workdir,
            killed_pids=sorted(self.killed),
            runtime=dict(self.seen),
        )

    def _take_result(self, name: str) -> Path | None:
        try:
            return copy_result(self.box / "out", name, self.workdir / name, RESULT_MAX_BYTES)
        except ResultFileError as exc:
            with self.log.path.open("ab") as log:  # the log is closed by now: append the note
                log.write(f"[gpuci] {name} not read: {exc}\n".encode())
            return None


def _read_preflight(directory: Path, name: str) -> dict[str, object]:
    try:
        data = json.loads(read_result(directory, name, 64 * 1024))
    except (ResultFileError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _expect_problem(runtime: Runtime, seen: Mapping[str, object]) -> str | None:
    """The first expected version the run does not have: `expected torch 2.13, found 2.12.1`."""
    for key, wanted in runtime.expect.items():
        found = str(seen.get(key) or "")
        if not version_matches(wanted, found):
            shown = found or "none"
            return f"runtime {runtime.name} expects {key} {wanted}, found {shown}"
    return None


def version_matches(wanted: str, found: str) -> bool:
    """`2.13` matches `2.13.0+cu130` and `2.13.1`, not `2.1` or `2.130`."""
    parts = found.split("+", 1)[0].split(".")
    want = wanted.split(".")
    return bool(found) and parts[: len(want)] == want


_IGNORED_SOURCES = shutil.ignore_patterns(".git", ".venv", "__pycache__")

# What the tests will see: Python, torch and the CUDA torch was built for (read from files, not
# imported: importing torch takes seconds), and, for real GPUs, the devices CUDA itself gives
# them (it honours CUDA_VISIBLE_DEVICES and the device nodes the sandbox shows).
_PREFLIGHT = """\
import ctypes, importlib.metadata, importlib.util, json, os, re, sys
out, count_devices = sys.argv[1], sys.argv[2] == "1"
seen = {"python": ".".join(map(str, sys.version_info[:3]))}
try:
    seen["torch"] = importlib.metadata.version("torch")
    spec = importlib.util.find_spec("torch")
    text = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read()
    cuda = re.search(r"^cuda\\s*(?::[^=]*)?=\\s*['\\"]([^'\\"]+)['\\"]", text, re.M)
    if cuda:
        seen["cuda"] = cuda.group(1)
except Exception as exc:
    if "torch" in seen:
        print(f"gpuci preflight: cannot read torch's CUDA version: {exc}")
if count_devices:
    count = 0
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        print(f"gpuci preflight: cannot load libcuda: {exc}")
    else:
        status = lib.cuInit(0)
        n = ctypes.c_int(0)
        if status == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0:
            count = n.value
        else:
            print(f"gpuci preflight: cuInit returned {status}")
    print(f"gpuci preflight: CUDA sees {count} device(s)")
    seen["devices"] = count
print("gpuci preflight: " + ", ".join(f"{k} {v}" for k, v in seen.items() if k != "devices"))
with open(out, "w") as f:
    json.dump(seen, f)
"""


def _fresh_workdir(work_root: Path, run_id: str) -> Path:
    """A new directory `<run_id>-<random>` that no earlier run can have touched. The root and
    the directory can be passed through but not listed by a run's user (mode 711)."""
    work_root.mkdir(parents=True, exist_ok=True)
    if work_root.stat().st_uid == os.geteuid():
        work_root.chmod(0o711)
    safe_id = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:80]
    workdir = work_root / f"{safe_id}-{secrets.token_hex(6)}"
    workdir.mkdir(mode=0o700)
    workdir.chmod(0o711)
    return workdir


def _chown_tree(root: Path, user: _User) -> None:
    """Hand a directory of the run's to its user."""
    for path in [root, *root.rglob("*")]:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)


class CappedLog:
    """A log file of at most `max_bytes` plus one note: the first half, then the latest output.

    The head streams to the file; the tail is held in memory and written on close, after a
    `[... N bytes omitted ...]` line when output was dropped in between.
    """

    def __init__(self, path: Path, max_bytes: int):
        self.path = path
        self._file = path.open("wb")
        self._head_left = max_bytes // 2
        self._tail_max = max_bytes - self._head_left
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.omitted = 0
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            head = data[: self._head_left]
            if head:
                self._file.write(head)
                self._head_left -= len(head)
            if len(data) > len(head):
                self._tail.append(data[len(head) :])
                self._tail_size += len(data) - len(head)
                self._trim_tail()

    def _trim_tail(self) -> None:
        while self._tail and self._tail_size - len(self._tail[0]) >= self._tail_max:
            self._tail_size -= len(self._tail[0])
            self.omitted += len(self._tail.popleft())

    def note(self, message: str) -> None:
        """A line from gpuci itself, marked as such."""
        self.write(f"[gpuci] {message}\n".encode())

    @property
    def truncated(self) -> bool:
        return self.omitted > 0 or self._tail_size > self._tail_max

    def close(self) -> None:
        with self._lock:
            tail = b"".join(self._tail)
            cut = max(0, len(tail) - self._tail_max)
            self.omitted += cut
            if self.omitted:
                self._file.write(f"\n[... {self.omitted} bytes omitted ...]\n".encode())
            self._file.write(tail[cut:])
            self._tail.clear()
            self._tail_size = 0
            self._file.close()

    def tail_text(self, lines: int) -> str:
        """The last `lines` lines of the closed log, as text."""
        with self.path.open("rb") as log:
            log.seek(max(0, self.path.stat().st_size - 256 * 1024))
            text = log.read().decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])


class _LogPump:
    """Copies a child's merged stdout/stderr into the log on a thread of its own."""

    def __init__(self, stream: IO[bytes], log: CappedLog):
        self._fd = stream.fileno()
        self._stream, self._log = stream, log
        self._soft_stop, self._hard_stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._pump, name="gpuci-log", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._hard_stop.is_set():
            if not poller.poll(100):
                if self._soft_stop.is_set():
                    return
                continue
            data = os.read(self._fd, _READ_CHUNK)
            if not data:
                return
            self._log.write(data)

    def finish(self) -> None:
        """After the child exited: drain what is buffered, but do not wait on a stray writer."""
        self._soft_stop.set()
        self._thread.join(_DRAIN_S)
        self._hard_stop.set()
        self._thread.join()
        self._stream.close()
