"""Four-GPU kernels, gated at runtime on the GPUs the CUDA driver shows the test. gpuci's
simulated GPUs have no driver behind them, so there every test skips: nothing is validated."""

import itertools

import pytest

HOPPER = (9, 0)


def require_gpus(cuda, count, needs, capability=(0, 0)):
    """Skip, saying what is missing, unless CUDA shows `count` GPUs of at least `capability`."""
    fit = [i for i in range(cuda.count) if cuda.capability(i) >= capability]
    if len(fit) < count:
        pytest.skip(f"{needs}; {cuda.shown()}")


@pytest.mark.parametrize("entry_point", ["flash_attn_func", "flash_attn_varlen_func"])
def test_flash_attention_3(cuda, expected_gpus, entry_point):
    needs = f"needs {expected_gpus} Hopper GPUs (compute capability 9.0) for FlashAttention-3"
    require_gpus(cuda, expected_gpus, needs, HOPPER)
    fa3 = pytest.importorskip("flash_attn_interface", reason="needs the FlashAttention-3 build")
    assert callable(getattr(fa3, entry_point))


@pytest.mark.parametrize("attribute", ["access", "native atomics"])
def test_peer_to_peer(cuda, expected_gpus, attribute):
    require_gpus(cuda, expected_gpus, f"needs {expected_gpus} GPUs with peer-to-peer links")
    pairs = itertools.permutations(range(expected_gpus), 2)
    missing = [pair for pair in pairs if not cuda.peer(attribute, *pair)]
    assert not missing, f"no peer {attribute} between GPUs {missing}"
