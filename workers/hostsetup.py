"""What this GPU host gives every run, resolved once at start from its settings: the sandbox,
the base environments and container engine, the installer, the caches."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.config import Runtime
from contract.settings import Settings
from workers import sandbox
from workers.caches import CachePlan
from workers.containers import ContainerHost
from workers.envs import EnvError, find_uv
from workers.runner import Environment
from workers.runtimes import HostRuntimes, RuntimesError, load_host_runtimes


class HostSetupError(Exception):
    """The host cannot run batches as configured; the message says what to change."""


class RuntimeUnavailable(Exception):
    """This host does not provide a run's runtime; the message names it."""


@dataclass(frozen=True)
class HostSetup:
    sandbox: sandbox.SandboxHost | None
    runtimes: HostRuntimes
    uv: str | None
    cache_root: Path
    cache_max_mb: int
    container: ContainerHost | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_settings(cls, settings: Settings, *, probe: bool = True) -> HostSetup:
        """Resolve and check everything; HostSetupError names the setting at fault."""
        try:
            kind = sandbox.resolve_kind(settings.sandbox)
            runtimes = load_host_runtimes(settings.runtimes_file, sys.executable)
            uv = find_uv(settings.uv)
        except (sandbox.SandboxError, RuntimesError, EnvError) as exc:
            raise HostSetupError(str(exc)) from None
        host = None
        warnings = []
        if kind == "bwrap":
            host = sandbox.SandboxHost(
                bwrap=str(sandbox.bwrap_path()),
                read_only=settings.paths_of("sandbox_read_only"),
                hidden=(*settings.paths_of("sandbox_hide"), *_secrets_of(settings)),
            )
            if probe:
                try:
                    sandbox.probe(host)
                except sandbox.SandboxError as exc:
                    raise HostSetupError(f"{exc}; or set GPUCI_SANDBOX=none (unsafe)") from None
        else:
            warnings.append(
                "GPUCI_SANDBOX=none: runs are NOT sandboxed; their tests can read this "
                "worker's files and processes and reach its network (never use this on a host "
                "that runs code you did not write)"
            )
        if uv is None:
            warnings.append("uv not found: runs' installs use pip (much slower warm installs)")
        engine = None
        if runtimes.engine:
            read_only = settings.paths_of("sandbox_read_only")
            engine = ContainerHost(runtimes.engine, runtimes.gpu_devices, read_only)
        return cls(
            sandbox=host,
            runtimes=runtimes,
            uv=uv,
            cache_root=Path(settings.cache_dir),
            cache_max_mb=settings.bytes_of("cache_max_size") // (1024 * 1024),
            container=engine,
            warnings=tuple(warnings),
        )

    def request_parts(self, runtime: Runtime, repo: str, trusted: bool) -> dict[str, Any]:
        """RunRequest fields for a run of `repo` with `runtime`; RuntimeUnavailable if this
        host lacks its base or engine."""
        caches = CachePlan(self.cache_root, repo, trusted, self.cache_max_mb)
        if runtime.image:
            if self.container is None:
                raise RuntimeUnavailable(
                    f"runtime {runtime.describe()} needs a container engine; this host's "
                    "runtimes file names none (engine: podman or docker)"
                )
            return {"container": self.container, "caches": caches}
        python = self.runtimes.base_python(runtime)
        if python is None:
            raise RuntimeUnavailable(
                f"this host does not provide base {runtime.base} (runtime {runtime.name}); "
                f"it has {', '.join(sorted(self.runtimes.bases))}"
            )
        return {
            "environment": Environment(python, runtime.base or "default", self.uv),
            "sandbox": self.sandbox,
            "caches": caches,
        }

    def describe(self) -> str:
        kind = "bubblewrap" if self.sandbox else "none"
        return f"sandbox {kind}; {self.runtimes.describe()}; installer {self.uv or 'pip'}"


def _secrets_of(settings: Settings) -> tuple[str, ...]:
    """Files of the worker's own that sit where runs could otherwise read them."""
    candidates = [settings.private_key_path, str(Path.cwd() / ".env")]
    return tuple(p for p in candidates if p and Path(p).exists())
