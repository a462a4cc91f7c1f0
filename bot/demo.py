"""`gpuci demo`: the whole system on this machine, playing a maintainer's day on GitHub."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from redis import Redis

from bot.redis_local import RedisUnavailable, local_redis
from contract.redact import redact_url
from contract.settings import Settings

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WORLD = EXAMPLES / "demo-world.yml"
ATTACKS = EXAMPLES / "hostile" / "test_attacks.py"  # what the fork's hostile commit adds
CPU_TESTS = "tests/test_cpu.py"
REPO = "acme/sample"
HOST = "demo-gpu-01"
SECRET = "gpuci-demo"
DEMO_DB = 9  # on a Redis that already runs, the demo uses (and flushes) only this database
AUTO = ("cpu", "1", "2")  # layer 2 of the sample repository
STEP_TIMEOUT_S = 180


class StoryFailed(Exception):
    """A step did not happen in time; the message says what was expected."""


def say(message: str = "") -> None:
    print(message, flush=True)


def run_demo(settings: Settings, *, once: bool = True) -> int:
    """Start everything, play the story, then serve the dashboard until Ctrl-C (or exit)."""
    signal.signal(signal.SIGTERM, _stop_on_sigterm)  # `kill` stops the demo's processes too
    try:
        with local_redis(settings.redis_url) as url, running_system(_demo_url(url)) as system:
            say(
                f"gpuci demo: Redis {system.redis_url}, fakehub {system.hub_url}, "
                f"dashboard {system.web_url}/, logs in {system.logs}\n"
            )
            if not system.sandboxed:
                say(
                    "gpuci demo: WARNING: bubblewrap is not installed: the demo's test runs "
                    "are NOT sandboxed (apt-get install -y bubblewrap)\n"
                )
            try:
                Story(system).play()
            except StoryFailed as exc:
                kept = _keep_logs(system.logs)
                raise StoryFailed(f"{exc} (the logs are kept in {kept})") from None
            say(f"\nThe dashboard: {system.web_url}/")
            if not once:
                _serve_until_interrupted()
    except RedisUnavailable as exc:
        print(f"gpuci demo: {exc}", file=sys.stderr)
        return 2
    except StoryFailed as exc:
        print(f"gpuci demo: {exc}", file=sys.stderr)
        return 1
    except _Terminated:
        print("gpuci demo: stopped by SIGTERM; so are its processes", file=sys.stderr)
        return 128 + signal.SIGTERM
    say("demo finished; every process it started has stopped.")
    return 0


class _Terminated(BaseException):
    """SIGTERM, raised where the demo is so that its cleanup runs (like Ctrl-C's)."""


def _stop_on_sigterm(_signum: int, _frame: object) -> None:
    raise _Terminated


def _demo_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + f"/{DEMO_DB}"


def _keep_logs(logs: Path) -> Path:
    """A copy of the processes' logs that outlives the demo's temporary directory."""
    kept = Path(tempfile.mkdtemp(prefix="gpuci-demo-logs-"))
    for log in logs.glob("*.log"):
        shutil.copy(log, kept / log.name)
    return kept


@contextlib.contextmanager
def _only_demo_on(redis_url: str) -> Iterator[None]:
    """One demo at a time per Redis database on this machine: two would share (and flush)
    database 9 and take each other's GPU tickets. A second one waits, saying why."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", redact_url(redis_url)).strip("-")
    with open(Path(tempfile.gettempdir(), f"gpuci-demo-{name}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"gpuci demo: another demo is using {redact_url(redis_url)}; waiting for it to end")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _serve_until_interrupted() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        say("Serving until Ctrl-C.")
        while True:
            time.sleep(3600)


# --- the system: fakehub, web (threads) and events, scheduler, GPU worker (processes) --------


@dataclass
class System:
    redis_url: str
    hub_url: str
    web_url: str
    logs: Path
    gpus_file: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # Runs are sandboxed where bubblewrap is installed; elsewhere the demo runs them without
    # (the worker would refuse to start) and skips the hostile scene.
    sandboxed: bool = field(default_factory=lambda: bool(shutil.which("bwrap")))

    def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = requests.request(method, f"{self.hub_url}/_fakehub/{path}", json=body, timeout=30)
        if answer.status_code >= 300:
            raise StoryFailed(f"fakehub refused {method} {path}: {answer.text}")
        return answer.json()

    def check_runs(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.control("GET", "state")["check_runs"]
        return found


@contextlib.contextmanager
def running_system(redis_url: str) -> Iterator[System]:
    from app import create_app
    from fakehub.testing import running, serving
    from fakehub.world import load_world

    with _only_demo_on(redis_url), tempfile.TemporaryDirectory(prefix="gpuci-demo-") as tmp:
        Redis.from_url(redis_url).flushdb()
        work = Path(tmp)
        world = load_world(WORLD, key_path=work / "app.pem")
        # the demo's repository is public: the dashboard shows its results without a token
        web = create_app(Settings(webhook_secret=SECRET, redis_url=redis_url, public_repos=REPO))
        with serving(web) as server:
            web_url = f"http://127.0.0.1:{server.port}"
            with running(world, webhook_url=f"{web_url}/webhook", webhook_secret=SECRET) as hub:
                system = System(redis_url, hub.url, web_url, work / "logs", work / "gpus.json")
                system.logs.mkdir()
                env = _environment(system, world.app.id, work)
                _write_gpus(system.gpus_file, foreign_on_last=True)
                try:
                    _start_processes(system, env)
                    yield system
                finally:
                    _stop_processes(system.processes)
                    Redis.from_url(redis_url).flushdb()


def _environment(system: System, app_id: int, work: Path) -> dict[str, str]:
    return {
        **os.environ,
        "REDIS_URL": system.redis_url,
        "GPUCI_APP_ID": str(app_id),
        "GPUCI_PRIVATE_KEY_PATH": str(work / "app.pem"),
        "GPUCI_GITHUB_API_URL": system.hub_url,
        "GPUCI_PUBLIC_URL": system.web_url,
        "GPUCI_GITHUB_WRITE_INTERVAL_S": "0",
        "GPUCI_HOST": HOST,
        "GPUCI_GPU_BACKEND": f"sim:{system.gpus_file}",
        "GPUCI_WORK_DIR": str(work / "runs"),
        "GPUCI_IDLE_SAMPLE_INTERVAL_S": "0.05",
        "GPUCI_KILL_GRACE_S": "2",
        "GPUCI_SANDBOX": "bwrap" if system.sandboxed else "none",
    }


def _write_gpus(path: Path, *, foreign_on_last: bool) -> None:
    """Eight simulated H20s; the last one busy with someone's notebook while `foreign_on_last`."""
    gpus: list[dict[str, Any]] = [
        {"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0"} for _ in range(8)
    ]
    if foreign_on_last:
        gpus[7]["memory_used_mb"] = 30000
        gpus[7]["processes"] = [{"pid": 4242, "used_memory_mb": 30000, "name": "jupyter"}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpus": gpus}))
    tmp.replace(path)


def _start_processes(system: System, env: dict[str, str]) -> None:
    for name, args in (
        ("events", ["events"]),
        ("scheduler", ["scheduler"]),
        ("worker", ["worker", "--host", HOST]),
    ):
        log = (system.logs / f"{name}.log").open("wb")
        system.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "bot.cli", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )


def _stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each process group, then SIGKILL what is left after 10 s."""
    for proc in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- the story ------------------------------------------------------------------------------


class Story:
    """Seven scenes, each printed as it happens; every completed Check Run printed once."""

    def __init__(self, system: System):
        self.system = system
        self.printed: set[int] = set()

    def play(self) -> None:
        maya_pr = self.maintainer_pr_runs_automatically()
        fork_pr = self.fork_pr_waits_for_approval()
        self.label_approves_and_runs(fork_pr)
        self.push_voids_the_approval(fork_pr)
        self.small_batch_runs_while_the_big_one_waits(maya_pr)
        self.hostile_tests_run_sandboxed(fork_pr, maya_pr)

    def maintainer_pr_runs_automatically(self) -> dict[str, Any]:
        self.scene(1, "maya (maintainer) opens a PR: layer 2 runs on GPUs automatically")
        pr = self.open_pr("maya", "faster-optimizer", REPO)
        self.await_checks(pr["head_sha"], AUTO, "completed")
        return pr

    def fork_pr_waits_for_approval(self) -> dict[str, Any]:
        self.scene(2, "carl (outside contributor) opens a PR from his fork: nothing runs")
        pr = self.open_pr("carl", "fix-typo", "carl/sample")
        checks = self.await_checks(pr["head_sha"], AUTO, "action_required")
        say(
            f"    each batch: action_required, {checks[0]['output']['title']!r}, "
            f"with an {checks[0]['actions'][0]['label']!r} button"
        )
        return pr

    def label_approves_and_runs(self, pr: dict[str, Any]) -> None:
        self.scene(3, "maya adds the label gpuci/approved: that exact commit runs")
        self.system.control(
            "POST", f"pulls/{REPO}/{pr['number']}/labels", {"user": "maya", "add": "gpuci/approved"}
        )
        self.await_checks(pr["head_sha"], AUTO, "completed")

    def push_voids_the_approval(self, pr: dict[str, Any]) -> None:
        self.scene(4, "carl pushes another commit: the approval does not carry over")
        pushed = self.system.control(
            "POST",
            f"pulls/{REPO}/{pr['number']}/push",
            {"files": {"setup.py": "import os  # new code\n"}},
        )
        self.await_checks(pushed["sha"], AUTO, "action_required")
        labels = self.labels_of(pr["number"])
        removed = "removed" if "gpuci/approved" not in labels else "STILL PRESENT"
        say(
            f"    label gpuci/approved {removed}; checks back to action_required until a "
            "maintainer approves the new commit"
        )

    def small_batch_runs_while_the_big_one_waits(self, pr: dict[str, Any]) -> None:
        """Batch 4 runs at once on idle GPUs; its tests' hardware gates find no CUDA driver
        behind the simulated GPUs, so it is not validated. Batch 8 waits for GPU 7."""
        self.scene(5, "maya comments `/gpuci run batch 4 8`; GPU 7 is busy with a foreign process")
        self.system.control(
            "POST",
            f"pulls/{REPO}/{pr['number']}/comments",
            {"user": "maya", "body": "/gpuci run batch 4 8"},
        )
        self.await_checks(pr["head_sha"], ("4",), "completed")
        waiting = self.wait_for("batch 8 to wait for GPUs", lambda: self._waiting(pr, "8"))
        say(f"    Check Run says: {waiting}")
        say("    ... the notebook on GPU 7 exits")
        _write_gpus(self.system.gpus_file, foreign_on_last=False)
        self.await_checks(pr["head_sha"], ("8",), "completed")

    def hostile_tests_run_sandboxed(self, fork: dict[str, Any], own: dict[str, Any]) -> None:
        """The fork's tests attack the host; the sandbox holds, and the next run is clean."""
        self.scene(6, "carl pushes tests that attack the GPU host; maya approves that commit")
        if not self.system.sandboxed:
            say(
                "    skipped: bubblewrap is not installed, so this demo's runs are not "
                "sandboxed (apt-get install -y bubblewrap, then run the demo again)"
            )
            return
        cpu = (EXAMPLES / "sample-repo" / CPU_TESTS).read_text()
        attacks = {CPU_TESTS: cpu + "\n\n" + ATTACKS.read_text()}
        pushed = self.system.control(
            "POST", f"pulls/{REPO}/{fork['number']}/push", {"files": attacks}
        )
        self.await_checks(pushed["sha"], ("cpu",), "action_required")
        self.system.control(
            "POST",
            f"pulls/{REPO}/{fork['number']}/labels",
            {"user": "maya", "add": "gpuci/approved"},
        )
        self.await_checks(pushed["sha"], ("cpu",), "completed")
        say(f"    after the run: {_after_the_attacks()}")
        self.scene(7, "maya's next run of batch cpu starts clean: `/gpuci run batch cpu`")
        before = {c["id"] for c in self.system.check_runs()}
        self.system.control(
            "POST",
            f"pulls/{REPO}/{own['number']}/comments",
            {"user": "maya", "body": "/gpuci run batch cpu"},
        )
        self.wait_for("a new Check Run of batch cpu", lambda: self._new_check(before, own))
        self.await_checks(own["head_sha"], ("cpu",), "completed")

    def _new_check(self, before: set[int], pr: dict[str, Any]) -> bool:
        latest = self._latest(pr["head_sha"]).get("gpuci / batch cpu")
        return bool(latest and latest["id"] not in before)

    # --- helpers of the scenes ---

    def scene(self, number: int, text: str) -> None:
        say(f"\n== {number}. {text}")

    def open_pr(self, author: str, branch: str, head_repo: str) -> dict[str, Any]:
        found = self.system.control(
            "POST",
            "pulls",
            {"repo": REPO, "author": author, "head": {"repo": head_repo, "ref": branch}},
        )
        pr: dict[str, Any] = found["pull"]
        say(f"    PR #{pr['number']} at {pr['head_sha'][:10]}")
        return pr

    def await_checks(
        self, sha: str, batches: tuple[str, ...], outcome: str
    ) -> list[dict[str, Any]]:
        """Wait until each batch's Check Run at `sha` is completed (or action_required)."""
        names = {f"gpuci / batch {b}" for b in batches}

        def done() -> list[dict[str, Any]] | None:
            latest = self._latest(sha)
            found = [latest[n] for n in names if n in latest]
            ok = len(found) == len(names) and all(_reached(c, outcome) for c in found)
            return found if ok else None

        checks = self.wait_for(f"{len(names)} Check Runs to be {outcome}", done)
        if outcome == "completed":
            for check in sorted(checks, key=lambda c: str(c["name"])):
                self.print_check(check)
        return checks

    def _latest(self, sha: str) -> dict[str, dict[str, Any]]:
        latest: dict[str, dict[str, Any]] = {}
        for run in sorted(self.system.check_runs(), key=lambda r: r["id"]):
            if run["head_sha"] == sha:
                latest[run["fields"]["name"]] = {"id": run["id"], **run["fields"]}
        return latest

    def labels_of(self, number: int) -> list[str]:
        for pull in self.system.control("GET", "state")["pulls"]:
            if pull["repo"] == REPO and pull["number"] == number:
                return list(pull.get("labels") or [])
        return []

    def _waiting(self, pr: dict[str, Any], batch: str) -> str | None:
        """The batch's wait reason once it waits for all but the foreign process's GPU."""
        check = self._latest(pr["head_sha"]).get(f"gpuci / batch {batch}")
        summary = str((check or {}).get("output", {}).get("summary", ""))
        return summary if "waiting for 8 idle GPUs; largest idle set: 7" in summary else None

    def wait_for(self, what: str, probe: Callable[[], Any]) -> Any:
        started = time.monotonic()
        last_note = started
        while True:
            found = probe()
            if found:
                return found
            now = time.monotonic()
            if now - started > STEP_TIMEOUT_S:
                raise StoryFailed(
                    f"timed out after {STEP_TIMEOUT_S}s waiting for {what}; "
                    "the process logs say why"
                )
            if now - last_note >= 5:
                say(f"    ... waiting for {what} ({now - started:.0f}s)")
                last_note = now
            time.sleep(0.3)

    def print_check(self, check: dict[str, Any]) -> None:
        from contract.checks import as_terminal

        if check["id"] in self.printed:
            return
        self.printed.add(check["id"])
        output = check.get("output") or {}
        rule = "-" * 78
        say(
            f"{rule}\n{check['name']}: {str(check.get('conclusion')).upper()} - "
            f"{output.get('title', '')}\n{rule}"
        )
        say(as_terminal(str(output.get("summary", ""))).rstrip())
        say(f"(details: {check.get('details_url')})")


def _after_the_attacks() -> str:
    """What is left of the hostile run on this machine: its daemon, its install."""
    daemons = 0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and b"600.4242" in (entry / "cmdline").read_bytes():
                daemons += 1
    planted = [p for p in sys.path if (Path(p) / "gpuci_demo_evil.pth").exists()]
    environment = "CHANGED: " + planted[0] if planted else "unchanged"
    return f"{daemons} of its processes alive, the worker's Python environment {environment}"


def _reached(check: dict[str, Any], outcome: str) -> bool:
    if outcome == "completed":
        return check.get("status") == "completed" and check.get("conclusion") != "action_required"
    return check.get("conclusion") == outcome
