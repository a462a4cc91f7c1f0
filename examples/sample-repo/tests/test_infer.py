"""Eight-GPU inference: passes, a strict XPASS (a failure), a teardown error, a slow test."""

import pytest


def test_sees_eight_gpus(gpus, expected_gpus):
    assert len(gpus) == expected_gpus == 8


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_generate(tp, gpus):
    assert len(gpus) % tp == 0


@pytest.mark.xfail(strict=True, reason="speculative decoding mismatch")
def test_speculative_decoding():
    assert True  # passes, but strict: pytest reports it as a failure


def test_kv_cache_release(leaky_resource):
    assert leaky_resource == "handle"


@pytest.mark.slow
def test_long_context_soak():
    raise AssertionError("deselected by the batch's markers")
