"""One-GPU checks: passes, a hardware-gated skip, an xfail and a non-strict XPASS."""

import pytest


def test_sees_one_gpu(gpus, expected_gpus):
    assert len(gpus) == expected_gpus == 1


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_optimizer_step(dtype):
    assert dtype in {"fp32", "fp16"}


@pytest.mark.skip(reason="needs FlashAttention-2")
def test_flash_attention():
    raise AssertionError("not reached")


@pytest.mark.xfail(reason="fused Adam diverges at lr=1e-2 (issue 88)")
def test_fused_adam_high_lr():
    raise AssertionError("diverged")


@pytest.mark.xfail(reason="bf16 overflow, fixed upstream?")
def test_bf16_overflow_fixed():
    assert True  # now passes: an XPASS that JUnit would report as a plain pass
