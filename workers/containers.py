"""Container runtimes: a run's steps inside one container of its image (podman or docker), with
only the leased GPUs, the run's directory and its caches, a non-root user, no capabilities and
no engine socket; removed, with everything in it, when the run ends."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

INSPECT_TIMEOUT_S = 60


class ContainerError(Exception):
    """The engine cannot run the image; the message has the engine's own words."""


@dataclass(frozen=True)
class ContainerHost:
    """The host's engine and how it passes GPUs: CDI names or `--gpus device=`."""

    engine: str  # podman | docker
    gpu_devices: str = "cdi"  # cdi | gpus
    read_only: tuple[str, ...] = ()  # host paths every container sees read-only


@dataclass(frozen=True)
class ContainerRun:
    """One run's container: its name, what it mounts and who runs in it."""

    name: str
    image: str
    box: Path
    user: str  # uid:gid
    gpu_indices: tuple[int, ...] = ()
    writable: tuple[Path, ...] = ()
    read_only: tuple[Path, ...] = ()
    network: bool = True


def start_command(host: ContainerHost, run: ContainerRun) -> list[str]:
    """Create the run's container, idle until its steps are executed in it."""
    args = [host.engine, "run", "--detach", "--init", "--rm", "--name", run.name]
    args += ["--user", run.user, "--cap-drop=ALL", "--security-opt=no-new-privileges"]
    args += ["--network", "bridge" if run.network else "none", "--pull=never"]
    args += ["--tmpfs", "/tmp", "--volume", f"{run.box}:{run.box}"]
    for path in run.writable:
        args += ["--volume", f"{path}:{path}"]
    for path in [*run.read_only, *map(Path, host.read_only)]:
        args += ["--volume", f"{path}:{path}:ro"]
    args += _gpu_args(host, run.gpu_indices)
    return [*args, "--entrypoint", "sleep", run.image, "infinity"]


def exec_command(
    host: ContainerHost, run: ContainerRun, argv: Sequence[str], cwd: Path, env: Mapping[str, str]
) -> list[str]:
    """Run one step in the container. Variables are named, not valued, on the command line:
    the engine takes their values from its own environment, so no secret is in `ps`."""
    args = [host.engine, "exec", "--user", run.user, "--workdir", str(cwd)]
    for name in sorted(env):
        args += ["--env", name]
    return [*args, run.name, *argv]


def stop_command(host: ContainerHost, run: ContainerRun, grace_s: float) -> list[str]:
    """SIGTERM every process of the container, SIGKILL after the grace period."""
    return [host.engine, "stop", "--time", str(max(0, int(grace_s))), run.name]


def remove_command(host: ContainerHost, run: ContainerRun) -> list[str]:
    """Stop and remove the container with every process in it (idempotent)."""
    return [host.engine, "rm", "--force", "--time", "0", run.name]


def _gpu_args(host: ContainerHost, indices: Sequence[int]) -> list[str]:
    if not indices:
        return []
    if host.gpu_devices == "gpus":
        return ["--gpus", f'"device={",".join(map(str, indices))}"']
    return [arg for i in indices for arg in ("--device", f"nvidia.com/gpu={i}")]


def image_digest(host: ContainerHost, image: str) -> str:
    """The local image's digest (`sha256:...`), or its id where it has no registry digest."""
    formats = ["{{.Digest}}", "{{.Id}}"] if host.engine == "podman" else ["{{.Id}}"]
    for form in formats:
        done = _engine(host, ["image", "inspect", "--format", form, image])
        value = done.strip().splitlines()[0] if done.strip() else ""
        if value.startswith("sha256:"):
            return value
    raise ContainerError(f"{host.engine} has no local image {image!r}: build or pull it first")


def usable(host: ContainerHost, image: str) -> str:
    """Why the engine cannot start a container of `image` here, or "" when it can."""
    try:
        _engine(host, ["run", "--rm", "--pull=never", "--entrypoint", "true", image])
    except ContainerError as exc:
        return str(exc)
    return ""


def _engine(host: ContainerHost, args: list[str]) -> str:
    try:
        done = subprocess.run(
            [host.engine, *args], capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ContainerError(f"{host.engine} {args[0]}: {exc}") from None
    if done.returncode != 0:
        raise ContainerError(f"{host.engine} {' '.join(args[:2])}: {done.stderr.strip()[-400:]}")
    return done.stdout
