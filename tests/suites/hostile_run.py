"""A hostile test file: what a fork PR's test could try on a GPU host. It records what each
attempt got in findings.json; tests/test_sandbox.py checks that nothing worked."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

found: dict[str, str] = {}
HOP = "import os, time\nwhile True:\n    if os.fork(): os._exit(0)\n    time.sleep(0.005)\n"
# Waits for the next run's directory to appear and makes its tests pass by collecting none.
WATCH = """\
import os, sys, time
root, seen = sys.argv[1], set(os.listdir(sys.argv[1]))
while True:
    for d in set(os.listdir(root)) - seen:
        for sub in ("box/src/tests", "src/tests"):
            p = os.path.join(root, d, sub)
            if os.path.isdir(p):
                open(os.path.join(p, "conftest.py"), "w").write("collect_ignore_glob = ['*']")
    time.sleep(0.01)
"""


def attempt(name, action):
    try:
        found[name] = "DONE: " + str(action())[:200]
    except Exception as exc:
        found[name] = "denied: " + type(exc).__name__


def only_if(condition):
    return condition or 1 / 0


def test_hostile():
    env = os.environ
    base, worker = Path(env["BASE_SITE"]), Path(env["WORKER_SITE"])
    own = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    pid = env["WORKER_PID"]
    attempt("write base site-packages", lambda: (base / "gpuci_evil.py").write_text("X = 1"))
    attempt("drop .pth in base", lambda: (base / "gpuci_evil.pth").write_text("import os"))
    attempt("write worker site-packages", lambda: (worker / "gpuci_evil.py").write_text("X = 1"))
    attempt("drop .pth in own layer", lambda: (own / "site-packages/gpuci_evil.pth").write_text(""))
    attempt("read worker HOME", lambda: Path(env["SECRET_PATH"]).read_text())
    attempt("read worker environ", lambda: Path(f"/proc/{pid}/environ").read_bytes())
    attempt("list worker processes", lambda: only_if(pid in os.listdir("/proc")))
    attempt("list run directories", lambda: os.listdir(env["WORK_ROOT"]))
    port = int(env["PORT"])
    attempt("connect to the host", lambda: socket.create_connection(("127.0.0.1", port), 2))
    marker, quiet = env["MARKER"], {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.Popen(["env", "-i", "setsid", "nohup", "sleep", f"600.{marker}"], **quiet)
    subprocess.Popen(["env", "-i", "setsid", sys.executable, "-c", HOP, f"hop-{marker}"])
    subprocess.Popen(["setsid", sys.executable, "-c", WATCH, env["WORK_ROOT"], marker], **quiet)
    time.sleep(0.3)  # let the daemons settle in
    Path("findings.json").write_text(json.dumps(found))
