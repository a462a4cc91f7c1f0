"""Every run in its own sandbox and its own environment, attacked as a hostile test would: real
bubblewrap, real virtual environments layered on a real base, real installs from local wheels,
real pytest."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.config import Runtime
from tests.sandboxing import (
    HERE_SITE,
    base_site,
    junit_counts,
    marked_processes,
    repo,
    request,
    tree_digest,
)
from workers import sandbox
from workers.envs import find_uv
from workers.runner import RunOutcome, run_batch

SUITES = Path(__file__).parent / "suites"


def suite(root: Path, name: str, as_name: str) -> Path:
    """A repository whose tests are `tests/suites/<name>`, as `tests/<as_name>`."""
    return repo(root, {as_name: (SUITES / name).read_text()})


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    yield server
    server.close()


def test_hostile_run_gets_nothing_and_leaves_nothing(
    tmp_path: Path, bwrap: str, base: Path, listener: socket.socket
) -> None:
    secret = tmp_path / "worker-home" / ".netrc"
    secret.parent.mkdir()
    secret.write_text("machine redis password TOPSECRET-4242")
    marker = f"gpuci{os.getpid()}x{time.monotonic_ns()}"
    env = {
        "BASE_SITE": str(base_site(base)),
        "WORKER_SITE": HERE_SITE,
        "SECRET_PATH": str(secret),
        "WORKER_PID": str(os.getpid()),
        "WORK_ROOT": str(tmp_path / "work"),
        "PORT": str(listener.getsockname()[1]),
        "MARKER": marker,
    }
    before = tree_digest(base.parent.parent)
    offline = Runtime("default", network="none")
    hostile = suite(tmp_path / "hostile", "hostile_run.py", "test_hostile.py")

    first = run_batch(request(tmp_path, hostile, base, bwrap=bwrap, runtime=offline, env=env))
    second = run_batch(
        request(
            tmp_path, suite(tmp_path / "next", "next_run.py", "test_next.py"), base, bwrap=bwrap
        )
    )

    assert junit_counts(first) == (1, 0), first.log_tail
    found = json.loads((first.workdir / "box" / "src" / "findings.json").read_text())
    assert found == {
        "write base site-packages": "denied: OSError",
        "drop .pth in base": "denied: OSError",
        "write worker site-packages": "denied: OSError",
        "drop .pth in own layer": found["drop .pth in own layer"],  # allowed: its own layer
        "read worker HOME": "denied: FileNotFoundError",
        "read worker environ": "denied: FileNotFoundError",
        "list worker processes": "denied: ZeroDivisionError",
        # Its own directory's path exists, as the mount point of its box; nothing else.
        "list run directories": f"DONE: [{first.workdir.name!r}]",
        "connect to the host": "denied: ConnectionRefusedError",  # its own empty network
    }
    assert found["drop .pth in own layer"].startswith("DONE")
    assert "TOPSECRET" not in first.log_path.read_text()
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing reached the host's port
    assert tree_digest(base.parent.parent) == before
    assert not Path(HERE_SITE, "gpuci_evil.py").exists()
    assert marked_processes(marker) == []  # the daemon, the PID hopper and the watcher are gone
    # The next run sees none of it, and its failing test fails.
    assert junit_counts(second) == (2, 1), second.log_tail
    assert not (second.workdir / "box" / "src" / "tests" / "conftest.py").exists()


def test_concurrent_runs_cannot_read_or_signal_each_other(
    tmp_path: Path, bwrap: str, base: Path
) -> None:
    source = suite(tmp_path / "src", "concurrent_run.py", "test_look.py")
    outcomes: dict[str, RunOutcome] = {}
    boxes = {"a": tmp_path / "work-a", "b": tmp_path / "work-b"}

    def run(me: str, other: str) -> None:
        env = {"ME": me, "OTHER": f"MARK_{other.upper()}", "OTHER_BOX": str(boxes[other])}
        env[f"MARK_{me.upper()}"] = "1"  # what the other run looks for in /proc/*/environ
        outcomes[me] = run_batch(
            request(tmp_path, source, base, bwrap=bwrap, env=env, work_root=boxes[me])
        )

    threads = [threading.Thread(target=run, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    for me in ("a", "b"):
        assert junit_counts(outcomes[me]) == (1, 0), outcomes[me].log_tail
        seen = (outcomes[me].workdir / "box" / "src" / "seen.txt").read_text()
        # Only its own processes: pytest itself (pid 1 is bwrap's init, not counted).
        reachable = int(seen.split("reachable=")[1].split()[0])
        assert f"{me} others=[] " in seen and reachable == 1 and seen.endswith("box=False")


def test_a_pr_sees_the_dependency_it_installs_and_the_next_run_does_not(
    tmp_path: Path, bwrap: str, base: Path, wheels: Path
) -> None:
    check = "import basepkg\n\ndef test_version():\n    assert basepkg.__version__ == {!r}\n"
    install = Runtime(
        "default", setup=(f"pip install --no-index --find-links {wheels} basepkg==2.0",)
    )
    uv = find_uv()

    changed = run_batch(
        request(tmp_path, repo(tmp_path / "pr", {"test_v.py": check.format("2.0")}), base,
                bwrap=bwrap, runtime=install, uv=uv, read_only=(wheels,))
    )  # fmt: skip
    after = run_batch(
        request(tmp_path, repo(tmp_path / "main", {"test_v.py": check.format("1.0")}), base,
                bwrap=bwrap, uv=uv)
    )  # fmt: skip

    assert junit_counts(changed) == (1, 0), changed.log_tail
    assert junit_counts(after) == (1, 0), after.log_tail
    assert changed.runtime["installer"] == ("uv" if uv else "pip")
    assert changed.runtime["sandbox"] == "bubblewrap"


def test_pip_is_the_fallback_without_uv(
    tmp_path: Path, bwrap: str, base: Path, wheels: Path
) -> None:
    check = "import basepkg\n\ndef test_version():\n    assert basepkg.__version__ == '2.0'\n"
    install = Runtime(
        "default", setup=(f"pip install --no-index --find-links {wheels} basepkg==2.0",)
    )
    source = repo(tmp_path / "pr", {"test_v.py": check})

    outcome = run_batch(
        request(tmp_path, source, base, bwrap=bwrap, runtime=install, uv=None, read_only=(wheels,))
    )

    assert junit_counts(outcome) == (1, 0), outcome.log_tail
    assert outcome.runtime["installer"] == "pip"


def test_an_expected_version_that_is_not_there_fails_setup_naming_both(
    tmp_path: Path, bwrap: str, base: Path
) -> None:
    runtime = Runtime("qualified", expect={"python": "2.7", "torch": "2.13"})
    source = repo(tmp_path / "src", {"test_ok.py": "def test_ok():\n    pass\n"})

    outcome = run_batch(request(tmp_path, source, base, bwrap=bwrap, runtime=runtime))

    found = ".".join(map(str, sys.version_info[:3]))
    assert outcome.preflight_error == f"runtime qualified expects python 2.7, found {found}"
    assert outcome.junit_path is None  # pytest did not run
    assert outcome.runtime["python"] == found


def test_no_network_without_a_sandbox_is_refused(tmp_path: Path, base: Path) -> None:
    source = repo(tmp_path / "src", {"test_ok.py": "def test_ok():\n    pass\n"})
    offline = Runtime("default", network="none")

    outcome = run_batch(request(tmp_path, source, base, bwrap=None, runtime=offline))

    assert outcome.setup_failed
    assert "network: none needs the sandbox" in outcome.log_tail


def test_a_missing_base_fails_the_run_saying_so(tmp_path: Path, bwrap: str) -> None:
    source = repo(tmp_path / "src", {"test_ok.py": "def test_ok():\n    pass\n"})

    outcome = run_batch(request(tmp_path, source, tmp_path / "nope" / "python", bwrap=bwrap))

    assert outcome.setup_failed
    assert f"base interpreter {tmp_path / 'nope' / 'python'} does not exist" in outcome.log_tail


# Replaces what pytest wrote, after it wrote it, with links to a file of the worker's.
SWAP_RESULTS = """\
import os

def pytest_unconfigure(config):
    out, secret = os.path.dirname(config.option.xmlpath), os.environ["SECRET_PATH"]
    if os.environ["SWAP"] == "junit":
        os.replace(os.path.join(out, "junit.xml"), os.path.join(out, "junit.real"))
        os.symlink(secret, os.path.join(out, "junit.xml"))
        os.mkfifo(os.path.join(out, "report.jsonl"))
    else:  # the whole directory: a link to one holding a junit.xml of the worker's
        os.rename(out, out + ".real")
        os.symlink(os.path.dirname(secret), out)
    try:  # the worker's log, one directory above the box (not in the sandbox's view)
        os.symlink(secret, os.path.join(out, "..", "..", "output.log"))
    except OSError:
        pass
"""


@pytest.mark.parametrize("swap", ["junit", "directory"])
def test_results_swapped_for_links_to_the_workers_files_are_not_read(
    tmp_path: Path, bwrap: str, base: Path, swap: str
) -> None:
    secret = tmp_path / "worker-only" / "junit.xml"  # the name a swapped directory would offer
    secret.parent.mkdir()
    secret.write_text("REDIS_URL=redis://:TOPSECRET-77@redis:6379")
    secret.chmod(0o600)
    source = repo(tmp_path / "src", {"test_ok.py": "def test_ok():\n    pass\n"})
    (source / "conftest.py").write_text(SWAP_RESULTS)
    env = {"SECRET_PATH": str(secret), "SWAP": swap}

    outcome = run_batch(request(tmp_path, source, base, bwrap=bwrap, env=env))

    assert outcome.junit_path is None and outcome.report_path is None
    log = outcome.log_path.read_text()
    assert "TOPSECRET" not in log and "TOPSECRET" not in outcome.log_tail
    assert "[gpuci] junit.xml not read:" in log and "[gpuci] report.jsonl not read:" in log
    assert ("is not a regular file" if swap == "junit" else "is not a directory") in log
    assert outcome.log_path.stat().st_nlink == 1 and not outcome.log_path.is_symlink()
    copies = [p for p in outcome.workdir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert not [p for p in copies if "TOPSECRET" in p.read_text(errors="replace")]


# --- the sandbox itself ------------------------------------------------------------------------


def test_only_the_leased_gpus_device_nodes_are_there(tmp_path: Path, bwrap: str) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ["nvidia0", "nvidia1", "nvidia2", "nvidia3", *sandbox.NVIDIA_CONTROL_NODES]:
        (dev / name).write_text("")
    box = tmp_path / "box"
    (box / "tmp").mkdir(parents=True)
    host = sandbox.SandboxHost(bwrap, dev_root=dev)

    shown = subprocess.run(
        sandbox.command(host, sandbox.Box(box, gpu_minors=(1, 3)), ["ls", "/dev"], box),
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    none = subprocess.run(
        sandbox.command(host, sandbox.Box(box), ["ls", "/dev"], box),
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip

    assert [n for n in shown if n.startswith("nvidia")] == [
        "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidia3", "nvidiactl",
    ]  # fmt: skip
    assert [n for n in none if n.startswith("nvidia")] == []  # a CPU batch gets none


def test_hidden_paths_and_everything_outside_the_system_are_absent(
    tmp_path: Path, bwrap: str
) -> None:
    shared = tmp_path / "datasets"  # a directory the host lets runs read...
    (shared / "imagenet").mkdir(parents=True)
    (shared / "imagenet" / "labels.txt").write_text("cat\n")
    settings = shared / "gpuci"  # ...with the worker's settings inside, hidden
    settings.mkdir()
    (settings / "gpuci.env").write_text("REDIS_URL=redis://:pw@host")
    key = shared / "app.pem"
    key.write_text("PRIVATE KEY")
    box = tmp_path / "box"
    box.mkdir()
    host = sandbox.SandboxHost(bwrap, read_only=(str(shared),), hidden=(str(settings), str(key)))
    script = (
        f"cat {shared}/imagenet/labels.txt; ls {settings}; cat {key}; echo key-read-done; "
        f"ls {tmp_path}; ls /root /home /run /var 2>&1 | head -c 2000; "
        f"touch {shared}/x /usr/gpuci-probe 2>&1; touch /tmp/t && touch own && echo own-box-ok"
    )

    shown = subprocess.run(
        sandbox.command(host, sandbox.Box(box), ["sh", "-c", script], box),
        capture_output=True, text=True, check=False,
    )  # fmt: skip

    out = shown.stdout + shown.stderr
    assert "cat\n" in out  # the shared data is there, read-only
    assert "gpuci.env" not in out and "PRIVATE KEY" not in out and "key-read-done" in out
    assert "No such file or directory" in out  # /root, /home, /run, /var are not there
    assert out.count("Read-only file system") == 2  # the shared data and the system
    assert "own-box-ok" in out and (box / "own").exists() and not (box / "tmp" / "t").exists()


def test_resolve_kind_needs_an_explicit_none_to_run_unsandboxed() -> None:
    assert sandbox.resolve_kind("none") == "none"
    with pytest.raises(sandbox.SandboxError, match="is not one of auto, bwrap, none"):
        sandbox.resolve_kind("off")
    if shutil.which("bwrap"):
        assert sandbox.resolve_kind("") == sandbox.resolve_kind("auto") == "bwrap"
