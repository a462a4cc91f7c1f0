"""The bubblewrap sandbox of a run's processes: their own PID, IPC and (optionally) network
namespace, the host's system directories read-only, only the run's own directory writable, and
only the leased GPUs' device nodes."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Host directories every sandbox sees read-only: what programs and libraries need. Everything
# else (HOME, /root, /home, /run with its sockets, /var, /tmp, /srv, /mnt, the worker's
# directories) is absent unless a run's environment or the host's settings add it.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
# Always hidden inside the system directories, even where the worker's user could read them.
ALWAYS_HIDDEN = ("/etc/gpuci",)
# The NVIDIA control nodes CUDA needs besides the GPUs' own /dev/nvidia<minor>.
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
NVIDIA_CAPS_DIR = "nvidia-caps"
SANDBOX_HOSTNAME = "gpuci-run"
TMPFS_BYTES = 1024**3  # /tmp inside; TMPDIR (in the run's directory, on disk) is for more
KINDS = ("auto", "bwrap", "none")
INSTALL_HINT = "install bubblewrap (apt-get install -y bubblewrap)"


class SandboxError(Exception):
    """The sandbox cannot be used on this host; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxHost:
    """What the host allows: the bwrap binary, and paths to add or hide for every run."""

    bwrap: str
    read_only: tuple[str, ...] = ()  # extra host paths runs may read (datasets, toolkits)
    hidden: tuple[str, ...] = ()  # host paths inside SYSTEM_DIRS that runs must not see
    dev_root: Path = Path("/dev")  # where the GPU device nodes are (a test folder in tests)


@dataclass(frozen=True)
class Box:
    """One run's view of the host. `box` is the run's writable directory, seen at the same path
    inside (so a virtual environment created inside works outside too); /tmp is a small
    memory file system of the sandbox's own (TMPDIR points into the box)."""

    box: Path
    read_only: tuple[Path, ...] = ()  # the base environment, uv, gpuci's pytest plugin
    writable: tuple[Path, ...] = ()  # caches the run may write
    read_only_caches: tuple[Path, ...] = ()  # caches the run may only read
    gpu_minors: tuple[int, ...] = ()  # /dev/nvidia<minor> of the leased GPUs
    network: bool = True
    extra_args: tuple[str, ...] = field(default=(), compare=False)


def bwrap_path() -> str:
    """Where bubblewrap is installed ("" when it is not)."""
    return shutil.which("bwrap") or ""


def resolve_kind(setting: str) -> str:
    """`bwrap` or `none` from the host setting: `auto` is bwrap where installed, else an error
    that says how to install it or how to run without a sandbox, explicitly."""
    kind = setting.strip().lower() or "auto"
    if kind not in KINDS:
        raise SandboxError(f"GPUCI_SANDBOX={setting!r} is not one of {', '.join(KINDS)}")
    if kind == "none":
        return "none"
    if not bwrap_path():
        raise SandboxError(
            f"bubblewrap (bwrap) is not installed, and every run is sandboxed by default: "
            f"{INSTALL_HINT}, or set GPUCI_SANDBOX=none to run tests unsandboxed (unsafe for "
            f"code you did not write)"
        )
    return "bwrap"


def probe(host: SandboxHost) -> None:
    """Start one trivial sandbox with every namespace a run uses; SandboxError if it fails
    (no user namespaces for this user, a seccomp policy, an old bwrap)."""
    command = [
        host.bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
        "--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts",
        "--die-with-parent", "true",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"bubblewrap does not start: {exc}") from exc
    if done.returncode != 0:
        raise SandboxError(
            f"bubblewrap cannot create a sandbox here ({done.stderr.strip() or done.returncode}); "
            "it needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) "
            "or a setuid bwrap"
        )


def command(host: SandboxHost, box: Box, argv: Sequence[str], cwd: Path) -> list[str]:
    """The bwrap command line that runs `argv` in `cwd` inside the run's sandbox."""
    args = [host.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--hostname", SANDBOX_HOSTNAME]
    if not box.network:
        args.append("--unshare-net")
    args += _system_mounts(host)
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
    args += ["--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
    args += _gpu_nodes(host.dev_root, box.gpu_minors)
    for path in _outermost([*box.read_only, *map(Path, host.read_only)]):
        args += ["--ro-bind", str(path), str(path)]
    args += _hidden_mounts(host)
    args += ["--bind", str(box.box), str(box.box)]
    for path in box.writable:
        args += ["--bind", str(path), str(path)]
    for path in box.read_only_caches:
        args += ["--ro-bind", str(path), str(path)]
    args += [*box.extra_args, "--chdir", str(cwd), "--", *argv]
    return args


def _system_mounts(host: SandboxHost) -> list[str]:
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():  # merged /usr: /bin -> usr/bin stays a link
            args += ["--symlink", str(path.readlink()), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    return args


def _hidden_mounts(host: SandboxHost) -> list[str]:
    """Empty stand-ins over hidden paths that are inside what the sandbox shows."""
    args: list[str] = []
    shown = [Path(p) for p in (*SYSTEM_DIRS, *host.read_only)]
    for name in (*ALWAYS_HIDDEN, *host.hidden):
        path = Path(name)
        if not any(root == path or root in path.parents for root in shown):
            continue  # not in anything the sandbox shows: absent anyway
        if path.is_dir() and not path.is_symlink():
            args += ["--tmpfs", name, "--remount-ro", name]
        elif path.exists():
            args += ["--ro-bind", "/dev/null", name]
    return args


def _gpu_nodes(dev_root: Path, minors: Iterable[int]) -> list[str]:
    """Device binds for the leased GPUs and, when any GPU is leased, CUDA's control nodes."""
    minors = list(minors)
    if not minors:
        return []
    names = [f"nvidia{minor}" for minor in minors] + list(NVIDIA_CONTROL_NODES)
    args: list[str] = []
    for name in names:
        node = dev_root / name
        if node.exists():
            args += ["--dev-bind", str(node), f"/dev/{name}"]
    caps = dev_root / NVIDIA_CAPS_DIR
    if caps.is_dir():
        args += ["--dev-bind", str(caps), f"/dev/{NVIDIA_CAPS_DIR}"]
    return args


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths that exist, without those inside another one or inside a system directory."""
    roots = [Path(p) for p in SYSTEM_DIRS if Path(p).is_dir() and not Path(p).is_symlink()]
    kept: list[Path] = []
    for path in sorted({p.resolve() for p in paths if p.exists()}, key=lambda p: len(p.parts)):
        if not any(path == k or k in path.parents for k in [*roots, *kept]):
            kept.append(path)
    return kept
