"""Fixtures of the sample project: how many GPUs this test process may use, and what the CUDA
driver shows it."""

import ctypes
import os

import pytest


def visible_gpus() -> list[str]:
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [d for d in value.split(",") if d.strip()]


@pytest.fixture
def gpus() -> list[str]:
    return visible_gpus()


@pytest.fixture
def expected_gpus() -> int:
    return int(os.environ.get("EXPECTED_GPUS", "0"))


@pytest.fixture
def broken_resource():
    raise RuntimeError("could not open the dataset cache (setup error on purpose)")


@pytest.fixture
def leaky_resource():
    yield "handle"
    raise RuntimeError("handle still open at teardown (teardown error on purpose)")


class Cuda:
    """The CUDA driver as this process sees it (it honours CUDA_VISIBLE_DEVICES). Without one,
    as on a CPU host or behind gpuci's simulated GPUs, it shows no GPU."""

    CAPABILITY = (75, 76)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _MINOR
    P2P = {"access": 2, "native atomics": 3}  # CU_DEVICE_P2P_ATTRIBUTE_*

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            self.lib = None
        ready = self.lib is not None and self.lib.cuInit(0) == 0
        self.count = self._get("cuDeviceGetCount") if ready else 0

    def _get(self, function, *args):
        value = ctypes.c_int(0)
        status = getattr(self.lib, function)(ctypes.byref(value), *args)
        if status != 0:
            raise RuntimeError(f"{function}{args} failed with CUDA error {status}")
        return value.value

    def capability(self, ordinal):
        device = self._get("cuDeviceGet", ordinal)
        return tuple(self._get("cuDeviceGetAttribute", a, device) for a in self.CAPABILITY)

    def peer(self, attribute, source, target):
        devices = (self._get("cuDeviceGet", source), self._get("cuDeviceGet", target))
        return bool(self._get("cuDeviceGetP2PAttribute", self.P2P[attribute], *devices))

    def shown(self):
        if self.lib is None:
            return "no CUDA driver found"
        return f"CUDA shows {self.count} GPU" + ("" if self.count == 1 else "s")


@pytest.fixture
def cuda():
    return Cuda()
