"""What the GPUs of this host are and which are idle: NVML, or an explicit `sim:` backend."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mb: int | None = None
    name: str = ""


@dataclass(frozen=True)
class GpuInfo:
    """One sample of one GPU. `error` set means the sample is unusable (and the GPU not idle)."""

    index: int
    uuid: str = ""
    name: str = ""
    memory_total_mb: int | None = None
    memory_used_mb: int | None = None
    utilization_pct: int | None = None
    compute_capability: str = ""  # "9.0"
    driver_version: str = ""
    cuda_version: str = ""  # "12.4"
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None

    @property
    def bf16(self) -> bool:
        major = self.compute_capability.split(".")[0]
        return major.isdigit() and int(major) >= 8


@dataclass(frozen=True)
class GpuState:
    """A GPU and the verdict on it: idle, or the reasons it is not."""

    gpu: GpuInfo
    idle: bool
    reasons: tuple[str, ...] = field(default_factory=tuple)
