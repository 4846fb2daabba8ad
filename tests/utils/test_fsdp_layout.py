"""Sharding models in the layouts RL keeps them in: convolutions in channels_last (FSDP takes only contiguous
weights, so the model is sharded in the standard layout), a trained fp32 part beside a bf16 backbone (FSDP
shards one dtype per unit) and methods run several times a step (a flow expert's denoise steps), whose parts are
units of their own; each computes what it computed before."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from ript.errors import RiptError
from ript.utils.fsdp import shard_model, whole


@pytest.fixture
def one_rank(tmp_path):
    """A process group of this process alone: what FSDP shards over."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def shards_and_computes_the_same(model: torch.nn.Module, run, methods: tuple[str, ...] = ()) -> None:
    """``run(model)`` (a scalar) and every weight's gradient are what they were before ``model`` was sharded."""
    expected = run(model)
    expected.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    shard_model(model, methods=methods)
    out = run(model)
    out.backward()
    assert torch.allclose(out, expected)
    for name, p in model.named_parameters():
        assert torch.allclose(whole(p.grad).float(), grads[name].float(), atol=1e-6), name


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


def test_a_channels_last_model_shards_and_computes_the_same(one_rank):
    model = Convs().to(memory_format=torch.channels_last)
    assert not model.layers[0].weight.is_contiguous()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    expected = model(x)
    shard_model(model)
    assert torch.allclose(model(x), expected, atol=1e-6)
    assert whole(model.layers[0].weight).shape == (4, 3, 3, 3)


class Mixed(torch.nn.Module):
    """A bf16 embedding and stack with an fp32 head and an fp32 norm inside a bf16 block, as π0's RL benchmark holds
    its prefix and its action expert."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 8).to(torch.bfloat16)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]).to(torch.bfloat16)
        self.block = torch.nn.ModuleDict({"proj": torch.nn.Linear(8, 8).to(torch.bfloat16),
                                          "norm": torch.nn.LayerNorm(8)})
        self.head = torch.nn.Linear(8, 3)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x).relu()
        x = self.block["norm"](self.block["proj"](x).float())
        return self.head(x).sum()


def test_a_model_of_two_dtypes_shards_each_apart_and_computes_the_same(one_rank):
    model = Mixed()
    shards_and_computes_the_same(model, lambda m: m(torch.tensor([[1, 2, 3], [4, 5, 6]])))
    assert whole(model.embed.weight).dtype == torch.bfloat16


def test_a_module_holding_two_dtypes_beside_the_root_is_refused_by_name(one_rank):
    model = Mixed()
    model.head.bias.data = model.head.bias.data.to(torch.bfloat16)
    with pytest.raises(RiptError, match="head.bias: torch.bfloat16 beside torch.float32"):
        shard_model(model)


class Denoiser(torch.nn.Module):
    """A prefix encoded once and an expert run on it several times a step, by methods other than ``forward``, as
    π0's ``encode`` and ``expert``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.projector = torch.nn.Linear(6, 8)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        self.parts = torch.nn.ModuleDict({"time": torch.nn.Linear(1, 8), "out": torch.nn.Linear(8, 3)})
        self.scale = torch.nn.Parameter(torch.ones(8))

    def encode(self, x):
        h = self.projector(x) * self.scale
        return [h := layer(h).tanh() for layer in self.layers]

    def expert(self, a, tau, cache):
        return self.parts["out"](cache[-1] + cache[0] * self.parts["time"](tau)) + a

    def run(self, x):
        cache, a = self.encode(x), torch.zeros(len(x), 3)
        for tau in (1.0, 0.5, 0.25):
            a = a - 0.5 * self.expert(a, torch.full((len(x), 1), tau), cache)
        return a.square().sum()


def test_methods_run_several_times_a_step_shard_by_parts_and_compute_the_same(one_rank):
    model, x = Denoiser(), torch.randn(4, 6)
    shards_and_computes_the_same(model, lambda m: m.run(x), methods=("encode", "expert"))
    parts = (model.projector, model.layers[0], model.parts["time"], model.parts["out"])
    assert all(isinstance(part, FSDPModule) for part in parts) and not isinstance(model.parts, FSDPModule)


class Tied(torch.nn.Module):
    """An embedding whose weight the output head reads too (a language model's tied embeddings)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(10, 8)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x).relu()
        return self.head(self.norm(x)).logsumexp(-1).sum()


def test_a_weight_two_modules_hold_stays_with_the_root_and_computes_the_same(one_rank):
    model = Tied()
    shards_and_computes_the_same(model, lambda m: m(torch.tensor([[1, 2, 3], [4, 5, 6]])))
    assert isinstance(model.norm, FSDPModule)
    assert not isinstance(model.embed, FSDPModule) and not isinstance(model.head, FSDPModule)


def test_weights_of_two_dtypes_left_to_the_root_are_refused_by_name(one_rank):
    model = Tied()
    model.embed.weight.data = model.embed.weight.data.to(torch.bfloat16)  # tied: the root holds it
    model.scale = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(RiptError, match="scale: torch.float32 beside torch.bfloat16"):
        shard_model(model)
