"""Sharding a model whose convolutions are in channels_last (as RL keeps them on a GPU): FSDP takes only
contiguous weights, so the model is sharded in the standard layout and computes what it computed before."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ript.utils.fsdp import shard_model, whole


class Convs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3)])
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return self.head(x.mean((2, 3)))


def test_a_channels_last_model_shards_and_computes_the_same(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = Convs().to(memory_format=torch.channels_last)
        assert not model.layers[0].weight.is_contiguous()
        x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
        expected = model(x)
        shard_model(model)
        assert torch.allclose(model(x), expected, atol=1e-6)
        assert whole(model.layers[0].weight).shape == (4, 3, 3, 3)
    finally:
        dist.destroy_process_group()
