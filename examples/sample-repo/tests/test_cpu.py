"""CPU-only checks: they must see no GPU at all."""


def test_sees_no_gpu(gpus, expected_gpus):
    assert len(gpus) == expected_gpus == 0


def test_tokenizer_roundtrip():
    text = "gpuci runs GPU tests"
    assert " ".join(text.split()) == text


def test_config_defaults():
    assert {"lr": 1e-3}.get("lr") == 1e-3
