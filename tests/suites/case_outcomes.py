"""Every outcome pytest reports, for JUnit parsing tests (run by tests/test_junit.py only)."""

import sys

import pytest

attempts = {"flaky": 0}


@pytest.fixture
def broken_setup():
    raise RuntimeError("GPU context could not be created")


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("leaked CUDA memory")


def test_pass():
    assert 1 + 1 == 2


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "<script>|*`"])
def test_param(dtype):
    assert dtype


def test_fail():
    total = 1 + 1
    assert total == 3, "matmul mismatch"


class TestOptimizer:
    def test_step(self):
        assert True

    def test_diverges(self):
        raise ValueError("loss is nan")


@pytest.mark.skip(reason="needs 4 GPUs")
def test_four_gpus_a():
    pass


@pytest.mark.skip(reason="needs 4 GPUs")
def test_four_gpus_b():
    pass


@pytest.mark.skipif(sys.platform != "nonexistent", reason="no bf16 on this GPU")
def test_bf16():
    pass


def test_runtime_skip():
    pytest.skip("FlashAttention-2 not installed")


@pytest.mark.xfail(reason="known cuBLAS bug")
def test_xfail_mark():
    raise AssertionError("wrong result")


def test_xfail_call():
    pytest.xfail("imperative xfail")


@pytest.mark.xfail(reason="was flaky on H20")
def test_xpass():
    pass


@pytest.mark.xfail(reason="fixed upstream?", strict=True)
def test_xpass_strict():
    pass


def test_setup_error(broken_setup):
    pass


def test_teardown_error(broken_teardown):
    pass


def test_fail_and_teardown_error(broken_teardown):
    raise AssertionError("both")


def test_flaky():
    attempts["flaky"] += 1
    assert attempts["flaky"] > 1, "first attempt fails"
