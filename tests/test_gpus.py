"""GPU backends (NVML, simulated), idle classification and the `gpuci gpus` views."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from contract.results import GpuInfo, GpuProcess
from workers.gpus import (
    GpuBackendError,
    NvmlBackend,
    NvmlUnavailable,
    SimBackend,
    classify,
    gpu_states,
    inventory_entry,
    open_backend,
    render_gpu_table,
)

MIB = 1024 * 1024
IDLE = GpuInfo(index=0, name="NVIDIA H20", memory_used_mb=0, utilization_pct=0)


def sim_file(path: Path, gpus: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"gpus": gpus}))
    return path


def h20(**overrides: Any) -> dict[str, Any]:
    return {"name": "NVIDIA H20", "memory_gb": 96, "compute_capability": "9.0", **overrides}


# --- simulated backend ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "names", "memory_mb", "ccs"),
    [
        ("sim:8xH20-96GB", ["NVIDIA H20"] * 8, [98304] * 8, ["9.0"] * 8),
        (
            "sim:2xA100-80GB,1xT4-16GB",
            ["NVIDIA A100", "NVIDIA A100", "NVIDIA T4"],
            [81920, 81920, 16384],
            ["8.0", "8.0", "7.5"],
        ),
        ("sim:1xL40S-48GB", ["NVIDIA L40S"], [49152], ["8.9"]),
        ("sim:1xRTX3090-24GB", ["NVIDIA RTX3090"], [24576], ["8.6"]),
        ("sim:1xV100-32GB", ["NVIDIA V100"], [32768], ["7.0"]),
        ("sim:4xFOO-24GB-cc8.6", ["NVIDIA FOO"] * 4, [24576] * 4, ["8.6"] * 4),
        ("sim:1xH100-80GB-cc7.5", ["NVIDIA H100"], [81920], ["7.5"]),
    ],
)
def test_sim_spec_describes_gpus(
    spec: str, names: list[str], memory_mb: list[int], ccs: list[str]
) -> None:
    gpus = open_backend(spec).snapshot()
    assert [g.name for g in gpus] == names
    assert [g.memory_total_mb for g in gpus] == memory_mb
    assert [g.compute_capability for g in gpus] == ccs
    assert [g.index for g in gpus] == list(range(len(names)))
    assert all(g.error is None and g.processes == () for g in gpus)


def test_sim_gpus_have_deterministic_identity() -> None:
    first, second = SimBackend("sim:2xH20-96GB").snapshot()
    assert first.uuid == "GPU-sim-00000000-0000-0000-0000-000000000000"
    assert second.uuid == "GPU-sim-00000000-0000-0000-0000-000000000001"
    assert (first.driver_version, first.cuda_version) == ("sim", "12.4")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sim:", "valid examples: sim:8xH20-96GB"),
        ("sim:8H20-96GB", "valid examples"),
        ("sim:8xH20", "valid examples"),
        ("sim:0xH20-96GB", "valid examples"),
        ("sim:2xH20-0GB", "valid examples"),
        ("sim:2xH20-96GB,", "valid examples"),
        ("sim:4xFOO-24GB", "-cc suffix, e.g. sim:4xFOO-24GB-cc8.0"),
        ("sim:4xFOO-24GB-cc8", "valid examples"),
        ("sim:/no/such/gpus.json", "cannot read simulated GPUs from /no/such/gpus.json"),
        ("gpu", "use 'nvml' or 'sim:<spec>'"),
        ("", "use 'nvml' or 'sim:<spec>'"),
        ("simulated", "use 'nvml' or 'sim:<spec>'"),
    ],
)
def test_bad_backend_setting_says_what_is_valid(spec: str, message: str) -> None:
    with pytest.raises(GpuBackendError, match=message.replace(".", r"\.").replace("*", r"\*")):
        open_backend(spec)


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json", "cannot read simulated GPUs"), ('{"gpu": []}', 'expected {"gpus": [...]}')],
)
def test_malformed_sim_file_is_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(content)
    with pytest.raises(GpuBackendError, match=message.replace("[", r"\[").replace("]", r"\]")):
        open_backend(f"sim:{path}")


def test_sim_file_is_reread_as_foreign_processes_come_and_go(tmp_path: Path) -> None:
    path = sim_file(tmp_path / "gpus.json", [h20(), h20()])
    backend = open_backend(f"sim:{path}")
    assert [s.idle for s in gpu_states(backend, {}, sleep=lambda _: None)] == [True, True]

    python = {"pid": 4242, "used_memory_mb": 30000, "name": "python"}
    sim_file(path, [h20(), h20(memory_used_mb=30000, utilization_pct=35, processes=[python])])
    states = gpu_states(backend, {}, sleep=lambda _: None)
    assert [s.idle for s in states] == [True, False]
    assert states[1].reasons == (
        "foreign process pid 4242 (python, 30000 MiB)",
        "memory used 30000 MiB > 256 MiB",
        "utilization 35%",
    )

    sim_file(path, [h20(), h20()])
    assert [s.idle for s in gpu_states(backend, {}, sleep=lambda _: None)] == [True, True]


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (h20(error="GPU is lost"), "GPU is lost"),
        (h20(memory_gb="lots"), "unparsable memory_gb: 'lots'"),
        (h20(compute_capability=9), 'compute_capability must be like "9.0", not 9'),
        (h20(utilization_pct=140), "unparsable utilization: 140"),
        (h20(processes=[{"name": "python"}]), "'pid'"),
        ({"memory_gb": 96, "compute_capability": "9.0"}, "'name'"),
    ],
)
def test_bad_sim_entry_fails_closed_for_that_gpu_only(
    tmp_path: Path, entry: dict[str, Any], error: str
) -> None:
    backend = open_backend(f"sim:{sim_file(tmp_path / 'gpus.json', [h20(), entry])}")
    good, bad = gpu_states(backend, {}, samples=1)
    assert good.idle
    assert not bad.idle
    assert bad.gpu.error is not None and error in bad.gpu.error
    assert bad.reasons[0].startswith("NVML error: ")


def test_sim_file_gives_uuid_and_defaults(tmp_path: Path) -> None:
    path = sim_file(tmp_path / "gpus.json", [h20(uuid="GPU-abc"), h20()])
    first, second = open_backend(f"sim:{path}").snapshot()
    assert (first.uuid, second.uuid) == ("GPU-abc", "GPU-sim-00000000-0000-0000-0000-000000000001")
    assert (second.memory_total_mb, second.memory_used_mb, second.utilization_pct) == (98304, 0, 0)


# --- idle classification -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "leased", "reasons"),
    [
        (IDLE, {}, ()),
        (IDLE, {0: "abc123"}, ("leased by run abc123",)),
        (IDLE, {1: "abc123"}, ()),
        (
            GpuInfo(0, memory_used_mb=0, utilization_pct=0, processes=(GpuProcess(4242, 0, "py"),)),
            {},
            ("foreign process pid 4242 (py, 0 MiB)",),
        ),
        (
            GpuInfo(0, memory_used_mb=0, utilization_pct=0, processes=(GpuProcess(7),)),
            {},
            ("foreign process pid 7 (memory unknown)",),
        ),
        (GpuInfo(0, memory_used_mb=256, utilization_pct=0), {}, ()),
        (
            GpuInfo(0, memory_used_mb=1024, utilization_pct=0),
            {},
            ("memory used 1024 MiB > 256 MiB",),
        ),
        (GpuInfo(0, memory_used_mb=0, utilization_pct=35), {}, ("utilization 35%",)),
        (GpuInfo(0, memory_used_mb=None, utilization_pct=0), {}, ("memory used unknown",)),
        (GpuInfo(0, memory_used_mb=0, utilization_pct=None), {}, ("utilization unknown",)),
        (GpuInfo(0, error="GPU is lost"), {}, ("NVML error: GPU is lost",)),
    ],
)
def test_classify_gives_each_reason(
    sample: GpuInfo, leased: dict[int, str], reasons: tuple[str, ...]
) -> None:
    (state,) = classify([[sample]], leased)
    assert state.reasons == reasons
    assert state.idle is (reasons == ())


def test_one_busy_sample_among_idle_ones_makes_the_gpu_busy() -> None:
    busy = GpuInfo(0, memory_used_mb=0, utilization_pct=3)
    (state,) = classify([[IDLE], [busy], [IDLE]], {})
    assert not state.idle
    assert state.reasons == ("utilization 3%",)


def test_an_error_in_any_sample_makes_the_gpu_busy() -> None:
    (state,) = classify([[IDLE], [GpuInfo(0, error="Unknown Error")], [IDLE]], {})
    assert state.reasons == ("NVML error: Unknown Error",)


def test_repeated_reasons_are_reported_once() -> None:
    busy = GpuInfo(0, memory_used_mb=0, utilization_pct=10)
    (state,) = classify([[busy], [busy], [busy]], {})
    assert state.reasons == ("utilization 10%",)


def test_gpu_missing_from_a_sample_is_not_idle() -> None:
    other = GpuInfo(1, memory_used_mb=0, utilization_pct=0)
    states = classify([[IDLE, other], [other]], {})
    assert [(s.gpu.index, s.idle) for s in states] == [(0, False), (1, True)]
    assert states[0].reasons == ("missing from 1 of 2 samples",)


def test_idle_memory_threshold_is_configurable() -> None:
    sample = GpuInfo(0, memory_used_mb=500, utilization_pct=0)
    assert classify([[sample]], {}, idle_memory_mb=512)[0].idle
    assert not classify([[sample]], {}, idle_memory_mb=256)[0].idle


def test_gpu_states_samples_the_backend_at_the_interval() -> None:
    class Counting:
        simulated = True
        calls = 0

        def snapshot(self) -> list[GpuInfo]:
            self.calls += 1
            return [IDLE]

        def describe(self) -> str:
            return "counting"

    backend, slept = Counting(), list[float]()
    states = gpu_states(backend, {}, samples=4, interval_s=0.5, sleep=slept.append)
    assert backend.calls == 4
    assert slept == [0.5, 0.5, 0.5]
    assert states[0].idle


# --- NVML ----------------------------------------------------------------------------------


def real_nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_real_nvml_without_a_gpu_is_unavailable_and_says_to_check_the_driver_first() -> None:
    """Without an NVIDIA driver the real library fails, with no fallback to sim; the advice
    is the driver's (`nvidia-smi`) before the simulated backend, which is for GPU-less tests."""
    if real_nvml_works():
        pytest.skip("this host has a working NVML")
    with pytest.raises(NvmlUnavailable) as raised:
        open_backend("nvml")
    message = str(raised.value)
    assert message.startswith("NVML is unavailable (")
    assert "NVML Shared Library Not Found" in message
    driver, simulate = message.find("nvidia-smi"), message.find("GPUCI_GPU_BACKEND=sim:")
    assert 0 < driver < simulate, message
    assert "Only on a machine without GPUs" in message


@pytest.mark.gpu
def test_real_nvml_reads_this_hosts_gpus() -> None:
    if not real_nvml_works():
        pytest.skip("needs an NVIDIA GPU and driver")
    backend = open_backend("nvml")
    gpus = backend.snapshot()
    assert gpus
    assert all(g.error is None and g.uuid.startswith("GPU-") for g in gpus)
    assert all(re.fullmatch(r"\d+\.\d", g.compute_capability) for g in gpus)
    assert all(re.fullmatch(r"\d+\.\d", g.cuda_version) for g in gpus)


class FakeNvml:
    """A stand-in pynvml module: two GPUs; `failing` maps (function, gpu index) to an error."""

    NVMLError = pynvml.NVMLError

    def __init__(self, failing: dict[tuple[str, int], Any] | None = None) -> None:
        self.failing = failing or {}
        self.processes: dict[int, list[Any]] = {0: [], 1: []}
        self.values: dict[tuple[str, int], Any] = {}

    def _answer(self, function: str, index: int, value: Any) -> Any:
        if (function, index) in self.failing:
            raise self.failing[(function, index)]
        return self.values.get((function, index), value)

    def nvmlInit(self) -> None:
        if ("nvmlInit", -1) in self.failing:
            raise self.failing[("nvmlInit", -1)]

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self._answer("nvmlDeviceGetCount", -1, 2)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        if pid == 999:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return "python"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return self._answer("nvmlDeviceGetHandleByIndex", index, index)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._answer("nvmlDeviceGetUUID", handle, f"GPU-{handle}")

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self._answer("nvmlDeviceGetName", handle, b"NVIDIA H20")

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        memory = SimpleNamespace(total=97871 * MIB, used=0, free=97871 * MIB)
        return self._answer("nvmlDeviceGetMemoryInfo", handle, memory)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return self._answer("nvmlDeviceGetUtilizationRates", handle, SimpleNamespace(gpu=0))

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self._answer("nvmlDeviceGetCudaComputeCapability", handle, (9, 0))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return self._answer("nvmlDeviceGetComputeRunningProcesses", handle, self.processes[handle])

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return self._answer("nvmlDeviceGetMinorNumber", handle, handle + 4)  # not the index


def test_nvml_backend_reads_every_gpu() -> None:
    nvml = FakeNvml()
    nvml.processes[1] = [
        SimpleNamespace(pid=4242, usedGpuMemory=30000 * MIB),
        SimpleNamespace(pid=999, usedGpuMemory=None),
    ]
    backend = NvmlBackend(nvml=nvml)
    first, second = backend.snapshot()
    assert first == GpuInfo(
        index=0,
        uuid="GPU-0",
        name="NVIDIA H20",
        memory_total_mb=97871,
        memory_used_mb=0,
        utilization_pct=0,
        compute_capability="9.0",
        driver_version="550.54.15",
        cuda_version="12.4",
        minor_number=4,
    )
    assert second.processes == (GpuProcess(4242, 30000, "python"), GpuProcess(999, None, ""))
    assert not backend.simulated
    assert backend.describe() == "nvml (driver 550.54.15)"


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetComputeRunningProcesses",
    ],
)
def test_nvml_error_on_one_gpu_fails_closed_for_that_gpu(function: str) -> None:
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    backend = NvmlBackend(nvml=FakeNvml(failing={(function, 1): lost}))
    good, bad = gpu_states(backend, {}, samples=2, sleep=lambda _: None)
    assert good.idle
    assert bad.gpu.error == f"{function}: GPU is lost"
    assert bad.reasons == (f"NVML error: {function}: GPU is lost",)
    assert not bad.idle


@pytest.mark.parametrize(
    ("function", "value", "error"),
    [
        ("nvmlDeviceGetMemoryInfo", SimpleNamespace(total=None, used=0), "memory total"),
        ("nvmlDeviceGetMemoryInfo", SimpleNamespace(total=1, used=-5), "memory used: -5"),
        ("nvmlDeviceGetUtilizationRates", SimpleNamespace(gpu=4294967295), "utilization"),
        ("nvmlDeviceGetCudaComputeCapability", ("9", 0), "CC major: '9'"),
        ("nvmlDeviceGetCudaComputeCapability", None, "unparsable NVML value"),
        ("nvmlDeviceGetMemoryInfo", object(), "unparsable NVML value"),
    ],
)
def test_unparsable_nvml_value_fails_closed(function: str, value: Any, error: str) -> None:
    nvml = FakeNvml()
    nvml.values[(function, 0)] = value
    first, second = NvmlBackend(nvml=nvml).snapshot()
    assert first.error is not None and error in first.error
    assert second.error is None


def test_nvml_that_cannot_count_gpus_is_a_backend_error() -> None:
    unknown = pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    backend = NvmlBackend(nvml=FakeNvml(failing={("nvmlDeviceGetCount", -1): unknown}))
    with pytest.raises(GpuBackendError, match="NVML cannot count the GPUs: Unknown Error"):
        backend.snapshot()


def test_nvml_init_failure_is_unavailable_with_the_library_reason() -> None:
    no_driver = pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable, match=r"NVML is unavailable \(Driver Not Loaded\)"):
        NvmlBackend(nvml=FakeNvml(failing={("nvmlInit", -1): no_driver}))


# --- what `gpuci gpus` prints --------------------------------------------------------------


def test_inventory_entries_form_a_hosts_inventory(tmp_path: Path) -> None:
    python = {"pid": 4242, "used_memory_mb": 30000, "name": "python"}
    path = sim_file(tmp_path / "g.json", [h20(), h20(memory_used_mb=30000, processes=[python])])
    states = gpu_states(open_backend(f"sim:{path}"), {0: "abc123"}, samples=1)
    inventory = json.loads(json.dumps({"h20-01": [inventory_entry(s) for s in states]}))
    first, second = inventory["h20-01"]
    assert {k: first[k] for k in ("name", "memory_gb", "compute_capability")} == {
        "name": "NVIDIA H20",
        "memory_gb": 96,
        "compute_capability": "9.0",
    }
    assert first["idle"] is False
    assert first["reasons"] == ["leased by run abc123"]
    assert first["bf16"] is True
    assert (first["driver"], first["cuda"], first["memory_mb"]) == ("sim", "12.4", 98304)
    assert second["processes"] == [python]


def test_inventory_entry_rounds_real_memory_to_whole_gb() -> None:
    entry = inventory_entry(GpuInfo(0, name="NVIDIA H20", memory_total_mb=97871))
    assert entry["memory_gb"] == 96
    assert entry["idle"] is None


def test_inventory_entry_of_an_old_gpu_has_no_bf16() -> None:
    (state,) = gpu_states(open_backend("sim:1xT4-16GB"), {}, samples=1)
    assert inventory_entry(state)["bf16"] is False


def test_gpu_table_says_idle_or_why_not(tmp_path: Path) -> None:
    python = {"pid": 4242, "used_memory_mb": 30000, "name": "python"}
    gpus = [h20(), h20(memory_used_mb=30000, utilization_pct=35, processes=[python]), {}]
    path = sim_file(tmp_path / "gpus.json", gpus)
    table = render_gpu_table(gpu_states(open_backend(f"sim:{path}"), {}, samples=1))
    header, idle, busy, broken = table.splitlines()
    assert header.split() == ["GPU", "NAME", "MEMORY", "UTIL", "CC", "STATE"]
    assert idle.split() == ["0", "NVIDIA", "H20", "0/98304", "MiB", "0%", "9.0", "idle"]
    assert busy.split()[:7] == ["1", "NVIDIA", "H20", "30000/98304", "MiB", "35%", "9.0"]
    assert busy.endswith(
        "busy: foreign process pid 4242 (python, 30000 MiB); "
        "memory used 30000 MiB > 256 MiB; utilization 35%"
    )
    assert broken.split()[:2] == ["2", "?"]
    assert "busy: NVML error: bad simulated GPU entry" in broken


def test_an_unknown_minor_number_leaves_the_gpu_usable_but_without_a_device_node() -> None:
    nvml = FakeNvml(
        {("nvmlDeviceGetMinorNumber", 1): pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)}
    )

    first, second = NvmlBackend(nvml=nvml).snapshot()

    assert (first.minor_number, second.minor_number) == (4, None)
    assert second.error is None  # a sandboxed run refuses it; an unsandboxed one may use it
