"""Two-GPU checks: one real failure to show annotations, and a setup error."""


def test_sees_two_gpus(gpus, expected_gpus):
    assert len(gpus) == expected_gpus == 2


def test_allreduce_sum(gpus):
    shards = [list(range(4)) for _ in gpus]
    assert [sum(col) for col in zip(*shards, strict=True)] == [0, 2, 4, 6]


def test_gradient_sync(gpus):
    grads = [1.0, 1.0000001]
    assert grads[0] == grads[1], "gradients diverged between ranks"


def test_checkpoint_reload(broken_resource):
    assert broken_resource
