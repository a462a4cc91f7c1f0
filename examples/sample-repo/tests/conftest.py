"""Fixtures of the sample project: how many GPUs this test process may use."""

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
