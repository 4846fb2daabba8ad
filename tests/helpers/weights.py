"""Checkpoint weights compared tensor for tensor."""

import torch
from safetensors.torch import load_file


def weights(run_dir):
    return load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
