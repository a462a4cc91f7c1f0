"""What a GPU host provides to runs: its base Python environments and its container engine,
declared in one file (GPUCI_RUNTIMES_FILE), advertised with the host's heartbeat."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contract.config import DEFAULT_BASE, Runtime

ENGINES = ("podman", "docker")
GPU_DEVICE_STYLES = ("cdi", "gpus")  # --device nvidia.com/gpu=N, or --gpus device=N
_KEYS = ("bases", "engine", "gpu_devices")


class RuntimesError(Exception):
    """The host's runtimes file is unusable; the message names the file, key and fix."""


@dataclass(frozen=True)
class HostRuntimes:
    """Base name -> interpreter path (`default` always there), and the container engine."""

    bases: dict[str, str] = field(default_factory=dict)
    engine: str | None = None
    gpu_devices: str = "cdi"

    def provides(self) -> list[str]:
        """Requirements met here, as `Runtime.requirement` spells them."""
        provided = [f"base:{name}" for name in sorted(self.bases)]
        return [*provided, "image"] if self.engine else provided

    def base_python(self, runtime: Runtime) -> str | None:
        """The interpreter of the runtime's base here, or None when the host has no such base."""
        return self.bases.get(runtime.base or DEFAULT_BASE)

    def describe(self) -> str:
        """`bases default, torch2.13-cu13.0; engine podman` (for logs and `gpuci runtimes`)."""
        engine = f"; engine {self.engine}" if self.engine else "; no container engine"
        return "bases " + ", ".join(sorted(self.bases)) + engine


def load_host_runtimes(path: str, default_python: str) -> HostRuntimes:
    """The host's runtimes: from the YAML file at `path` (none: only the default base, which is
    `default_python` unless the file names another)."""
    if not path:
        return HostRuntimes({DEFAULT_BASE: default_python})
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise RuntimesError(f"{path}: cannot read the runtimes file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise RuntimesError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RuntimesError(f"{path}: expected a mapping with bases: and engine:")
    unknown = sorted(set(map(str, data)) - set(_KEYS))
    if unknown:
        raise RuntimesError(f"{path}: unknown key {unknown[0]!r}; keys are {', '.join(_KEYS)}")
    bases = {DEFAULT_BASE: default_python, **_bases(path, data.get("bases") or {})}
    engine = _engine(path, data.get("engine"))
    style = str(data.get("gpu_devices") or ("cdi" if engine != "docker" else "gpus"))
    if style not in GPU_DEVICE_STYLES:
        raise RuntimesError(f"{path}: gpu_devices {style!r} is not cdi or gpus")
    return HostRuntimes(bases, engine, style)


def _bases(path: str, bases: Any) -> dict[str, str]:
    if not isinstance(bases, dict):
        example = "torch2.13-cu13.0: /opt/gpuci/bases/torch2.13-cu13.0/bin/python"
        raise RuntimesError(f"{path}: bases must map a name to its interpreter, e.g. {example}")
    found = {}
    for name, python in bases.items():
        where = f"{path}: bases.{name}"
        if not isinstance(python, str) or not os.path.isabs(python):
            raise RuntimesError(f"{where}: give the absolute path of the base's python")
        if not os.access(python, os.X_OK):
            raise RuntimesError(f"{where}: {python} is not an executable file on this host")
        found[str(name)] = python
    return found


def _engine(path: str, engine: Any) -> str | None:
    if engine in (None, "", "none"):
        return None
    if engine not in ENGINES:
        raise RuntimesError(f"{path}: engine {engine!r} is not podman, docker or none")
    if shutil.which(str(engine)) is None:
        raise RuntimesError(f"{path}: engine {engine} is not installed on this host")
    return str(engine)
