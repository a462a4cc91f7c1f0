"""What the GPUs of this host are and which are idle: NVML, or an explicit `sim:` backend."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pynvml

from contract.results import GpuInfo, GpuProcess

SIM_EXAMPLES = (
    "sim:8xH20-96GB, sim:2xA100-80GB,1xT4-16GB, sim:4xFOO-24GB-cc8.6, sim:/path/gpus.json"
)
# What to do when NVML does not load: on a GPU host that is a driver problem, never a reason
# to simulate GPUs (runs would pass without touching one).
DRIVER_HINT = (
    "check the NVIDIA driver first: `nvidia-smi` must list this host's GPUs (install or repair "
    "the driver; libnvidia-ml.so.1 must load). Only on a machine without GPUs, for tests and "
    "demos, set GPUCI_GPU_BACKEND=sim:8xH20-96GB"
)
SIM_DRIVER = "sim"
SIM_CUDA = "12.4"

# Compute capability of the models a `sim:` spec may name without a `-ccX.Y` suffix.
MODEL_COMPUTE_CAPABILITY = {
    "H20": "9.0",
    "H100": "9.0",
    "H200": "9.0",
    "GH200": "9.0",
    "A100": "8.0",
    "A30": "8.0",
    "A10": "8.6",
    "A40": "8.6",
    "RTX3090": "8.6",
    "L4": "8.9",
    "L40": "8.9",
    "L40S": "8.9",
    "RTX4090": "8.9",
    "T4": "7.5",
    "V100": "7.0",
}

_SIM_GROUP = re.compile(r"(\d+)x([A-Za-z0-9]+)-(\d+)GB(?:-cc(\d+\.\d+))?", re.IGNORECASE)
_COMPUTE_CAPABILITY = re.compile(r"\d+\.\d+")


@dataclass(frozen=True)
class GpuState:
    """A GPU and the verdict on it: idle, or the reasons it is not."""

    gpu: GpuInfo
    idle: bool
    reasons: tuple[str, ...] = field(default_factory=tuple)


class GpuBackendError(Exception):
    """The GPUs of this host cannot be read (or the backend setting is wrong)."""


class NvmlUnavailable(GpuBackendError):
    """The NVML library is missing or does not initialise; never replaced by simulation."""


class GpuBackend(Protocol):
    simulated: bool

    def snapshot(self) -> list[GpuInfo]: ...

    def describe(self) -> str: ...


class _ReadError(Exception):
    """One GPU's reading failed; the message is the reason shown to the user."""


class NvmlBackend:
    """Real GPUs through NVML. `nvml` is the pynvml module (a stand-in in tests)."""

    simulated = False

    def __init__(self, nvml: Any = pynvml) -> None:
        self._nvml = nvml
        self.start()

    def start(self) -> None:
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            reason = str(exc) or type(exc).__name__
            raise NvmlUnavailable(f"NVML is unavailable ({reason}); {DRIVER_HINT}") from exc

    def close(self) -> None:
        with contextlib.suppress(pynvml.NVMLError):
            self._nvml.nvmlShutdown()

    def describe(self) -> str:
        try:
            return f"nvml (driver {_text(self._nvml.nvmlSystemGetDriverVersion())})"
        except pynvml.NVMLError:
            return "nvml"

    def snapshot(self) -> list[GpuInfo]:
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise GpuBackendError(f"NVML cannot count the GPUs: {exc}") from exc
        return [self._read(index) for index in range(count)]

    def _read(self, index: int) -> GpuInfo:
        try:
            return self._query(index)
        except _ReadError as exc:
            return GpuInfo(index=index, error=str(exc))
        except (TypeError, ValueError, AttributeError) as exc:
            return GpuInfo(index=index, error=f"unparsable NVML value: {exc}")

    def _query(self, index: int) -> GpuInfo:
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", handle)
        return GpuInfo(
            index=index,
            uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
            name=_text(self._call("nvmlDeviceGetName", handle)),
            memory_total_mb=_mib(memory.total, "memory total"),
            memory_used_mb=_mib(memory.used, "memory used"),
            utilization_pct=_percent(self._call("nvmlDeviceGetUtilizationRates", handle).gpu),
            compute_capability=f"{_whole(major, 'CC major')}.{_whole(minor, 'CC minor')}",
            driver_version=_text(self._call("nvmlSystemGetDriverVersion")),
            cuda_version=_cuda_version(self._call("nvmlSystemGetCudaDriverVersion")),
            processes=tuple(self._process(p) for p in self._compute_processes(handle)),
            minor_number=self._minor_number(handle),
        )

    def _minor_number(self, handle: Any) -> int | None:
        """Unknown where NVML cannot say (a sandboxed run then refuses to start on the GPU)."""
        try:
            return _whole(self._nvml.nvmlDeviceGetMinorNumber(handle), "minor number")
        except (pynvml.NVMLError, _ReadError, AttributeError):
            return None

    def _compute_processes(self, handle: Any) -> list[Any]:
        return list(self._call("nvmlDeviceGetComputeRunningProcesses", handle))

    def _process(self, proc: Any) -> GpuProcess:
        used = proc.usedGpuMemory
        return GpuProcess(
            pid=_whole(proc.pid, "process pid"),
            used_memory_mb=None if used is None else _mib(used, "process memory"),
            name=self._process_name(proc.pid),
        )

    def _process_name(self, pid: int) -> str:
        """Cosmetic only: another container's process often has no readable name."""
        try:
            return _text(self._nvml.nvmlSystemGetProcessName(pid))
        except pynvml.NVMLError:
            return ""

    def _call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(*args)
        except pynvml.NVMLError as exc:
            raise _ReadError(f"{function}: {exc}") from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _ReadError(f"unparsable {what}: {value!r}")
    return value


def _mib(value: Any, what: str) -> int:
    return _whole(value, what) // (1024 * 1024)


def _percent(value: Any) -> int:
    pct = _whole(value, "utilization")
    if pct > 100:
        raise _ReadError(f"unparsable utilization: {pct!r}")
    return pct


def _cuda_version(value: Any) -> str:
    """NVML gives the CUDA driver version as 1000*major + 10*minor: 12040 -> "12.4"."""
    version = _whole(value, "CUDA version")
    return f"{version // 1000}.{version % 1000 // 10}"


class SimBackend:
    """Simulated GPUs from a spec: `8xH20-96GB`, several groups joined by commas, or a JSON file.

    The JSON file is re-read on every snapshot, so a test or the demo can make foreign
    processes appear and leave. Its format (all keys but name, memory_gb and
    compute_capability optional)::

        {"gpus": [{"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0",
                   "memory_used_mb": 0, "utilization_pct": 0,
                   "processes": [{"pid": 4242, "used_memory_mb": 30000, "name": "python"}],
                   "error": null}]}

    A malformed GPU entry becomes that GPU's `error` (not idle), as an NVML failure would.
    """

    simulated = True

    def __init__(self, spec: str) -> None:
        self.spec = spec.strip().removeprefix("sim:")
        self._path = Path(self.spec) if _is_file_spec(self.spec) else None
        self._fixed = [] if self._path else parse_sim_spec(self.spec)
        self.snapshot()

    def describe(self) -> str:
        return f"simulated GPUs (sim:{self.spec})"

    def snapshot(self) -> list[GpuInfo]:
        if self._path is None:
            return list(self._fixed)
        return [_sim_gpu(i, entry) for i, entry in enumerate(_read_sim_file(self._path))]


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".json") or "/" in spec


def parse_sim_spec(spec: str) -> list[GpuInfo]:
    """`2xA100-80GB,1xT4-16GB` -> three idle GPUs; unknown models need a `-ccX.Y` suffix."""
    groups = [_sim_group(group.strip()) for group in spec.split(",")]
    models = [model for count, model in groups for _ in range(count)]
    return [_sim_gpu_from_model(index, *model) for index, model in enumerate(models)]


def _sim_group(group: str) -> tuple[int, tuple[str, int, str]]:
    match = _SIM_GROUP.fullmatch(group)
    if not match or int(match[1]) < 1 or int(match[3]) < 1:
        raise GpuBackendError(f"bad simulated GPU spec {group!r}; valid examples: {SIM_EXAMPLES}")
    model = match[2].upper()
    compute_capability = match[4] or MODEL_COMPUTE_CAPABILITY.get(model)
    if compute_capability is None:
        raise GpuBackendError(
            f"unknown GPU model {match[2]!r} in {group!r}: give its compute capability "
            f"with a -cc suffix, e.g. sim:{match[1]}x{match[2]}-{match[3]}GB-cc8.0"
        )
    return int(match[1]), (model, int(match[3]), compute_capability)


def _sim_gpu_from_model(index: int, model: str, memory_gb: int, cc: str) -> GpuInfo:
    entry = {"name": f"NVIDIA {model}", "memory_gb": memory_gb, "compute_capability": cc}
    return _sim_gpu(index, entry)


def _sim_uuid(index: int) -> str:
    return f"GPU-sim-00000000-0000-0000-0000-{index:012d}"


def _read_sim_file(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GpuBackendError(f"cannot read simulated GPUs from {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise GpuBackendError(
            f'{path}: expected {{"gpus": [...]}} (see workers.gpus.SimBackend for the format)'
        )
    return data["gpus"]


def _sim_gpu(index: int, entry: Any) -> GpuInfo:
    try:
        return _sim_gpu_fields(index, entry)
    except (_ReadError, KeyError, TypeError, ValueError, AttributeError) as exc:
        return GpuInfo(index=index, uuid=_sim_uuid(index), error=f"bad simulated GPU entry: {exc}")


def _sim_gpu_fields(index: int, entry: Mapping[str, Any]) -> GpuInfo:
    cc = entry["compute_capability"]
    if not isinstance(cc, str) or not _COMPUTE_CAPABILITY.fullmatch(cc):
        raise _ReadError(f'compute_capability must be like "9.0", not {cc!r}')
    return GpuInfo(
        index=index,
        uuid=str(entry.get("uuid") or _sim_uuid(index)),
        name=str(entry["name"]),
        memory_total_mb=_whole(entry["memory_gb"], "memory_gb") * 1024,
        memory_used_mb=_whole(entry.get("memory_used_mb", 0), "memory_used_mb"),
        utilization_pct=_percent(entry.get("utilization_pct", 0)),
        compute_capability=cc,
        driver_version=SIM_DRIVER,
        cuda_version=SIM_CUDA,
        processes=tuple(_sim_process(p) for p in entry.get("processes") or ()),
        error=None if entry.get("error") is None else str(entry["error"]),
        minor_number=index,
    )


def _sim_process(entry: Mapping[str, Any]) -> GpuProcess:
    used = entry.get("used_memory_mb")
    return GpuProcess(
        pid=_whole(entry["pid"], "pid"),
        used_memory_mb=None if used is None else _whole(used, "used_memory_mb"),
        name=str(entry.get("name", "")),
    )


def open_backend(setting: str) -> GpuBackend:
    """`nvml` or `sim:<spec>` (GPUCI_GPU_BACKEND); a missing NVML never falls back to sim."""
    setting = setting.strip()
    if setting == "nvml":
        return NvmlBackend()
    if setting.startswith("sim:"):
        return SimBackend(setting)
    raise GpuBackendError(
        f"unknown GPU backend {setting!r}: use 'nvml' or 'sim:<spec>', e.g. {SIM_EXAMPLES}"
    )


def classify(
    samples: Sequence[Sequence[GpuInfo]],
    leased: Mapping[int, str],
    idle_memory_mb: int = 256,
) -> list[GpuState]:
    """Idle = not leased, no compute process, memory <= threshold, utilization 0, no error,
    in every sample. `leased` maps a GPU index to the run holding it."""
    by_index: dict[int, list[GpuInfo]] = {}
    for snapshot in samples:
        for gpu in snapshot:
            by_index.setdefault(gpu.index, []).append(gpu)
    states = []
    for index in sorted(by_index):
        seen = by_index[index]
        reasons = _busy_reasons(seen, leased.get(index), idle_memory_mb)
        if len(seen) < len(samples):
            reasons.append(f"missing from {len(samples) - len(seen)} of {len(samples)} samples")
        states.append(GpuState(gpu=seen[-1], idle=not reasons, reasons=tuple(reasons)))
    return states


def _busy_reasons(seen: Sequence[GpuInfo], lessee: str | None, idle_memory_mb: int) -> list[str]:
    reasons = [f"leased by run {lessee}"] if lessee is not None else []
    for gpu in seen:
        reasons.extend(_sample_reasons(gpu, idle_memory_mb))
    return list(dict.fromkeys(reasons))


def _sample_reasons(gpu: GpuInfo, idle_memory_mb: int) -> list[str]:
    if gpu.error:
        return [f"NVML error: {gpu.error}"]
    reasons = [_process_reason(proc) for proc in gpu.processes]
    if gpu.memory_used_mb is None:
        reasons.append("memory used unknown")
    elif gpu.memory_used_mb > idle_memory_mb:
        reasons.append(f"memory used {gpu.memory_used_mb} MiB > {idle_memory_mb} MiB")
    if gpu.utilization_pct is None:
        reasons.append("utilization unknown")
    elif gpu.utilization_pct > 0:
        reasons.append(f"utilization {gpu.utilization_pct}%")
    return reasons


def _process_reason(proc: GpuProcess) -> str:
    memory = "memory unknown" if proc.used_memory_mb is None else f"{proc.used_memory_mb} MiB"
    details = f"{proc.name}, {memory}" if proc.name else memory
    return f"foreign process pid {proc.pid} ({details})"


def gpu_states(
    backend: GpuBackend,
    leased: Mapping[int, str],
    samples: int = 3,
    interval_s: float = 0.2,
    idle_memory_mb: int = 256,
    sleep: Callable[[float], object] = time.sleep,
) -> list[GpuState]:
    """Sample the backend `samples` times, `interval_s` apart, and classify each GPU."""
    taken = [backend.snapshot()]
    for _ in range(samples - 1):
        sleep(interval_s)
        taken.append(backend.snapshot())
    return classify(taken, leased, idle_memory_mb)


def inventory_entry(state_or_info: GpuState | GpuInfo) -> dict[str, Any]:
    """One GPU as `gpuci gpus --json` prints it; also a valid `--hosts` inventory entry."""
    if isinstance(state_or_info, GpuState):
        gpu, idle, reasons = state_or_info.gpu, state_or_info.idle, list(state_or_info.reasons)
    else:
        gpu, idle, reasons = (
            state_or_info,
            None,
            [state_or_info.error] if state_or_info.error else [],
        )
    total = gpu.memory_total_mb
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_gb": None if total is None else round(total / 1024),
        "memory_mb": total,
        "compute_capability": gpu.compute_capability,
        "bf16": gpu.bf16,
        "driver": gpu.driver_version,
        "cuda": gpu.cuda_version,
        "idle": idle,
        "reasons": reasons,
        "processes": [
            {"pid": p.pid, "used_memory_mb": p.used_memory_mb, "name": p.name}
            for p in gpu.processes
        ],
    }


def render_gpu_table(states: Sequence[GpuState]) -> str:
    """The human `gpuci gpus` output: one line per GPU, idle or why not."""
    header = ("GPU", "NAME", "MEMORY", "UTIL", "CC", "STATE")
    rows = [header, *(_table_row(state) for state in states)]
    widths = [max(len(row[col]) for row in rows) for col in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def _table_row(state: GpuState) -> tuple[str, str, str, str, str, str]:
    gpu = state.gpu
    used = "?" if gpu.memory_used_mb is None else str(gpu.memory_used_mb)
    total = "?" if gpu.memory_total_mb is None else str(gpu.memory_total_mb)
    util = "?" if gpu.utilization_pct is None else f"{gpu.utilization_pct}%"
    verdict = "idle" if state.idle else "busy: " + "; ".join(state.reasons)
    return (
        str(gpu.index),
        gpu.name or "?",
        f"{used}/{total} MiB",
        util,
        gpu.compute_capability or "?",
        verdict,
    )
