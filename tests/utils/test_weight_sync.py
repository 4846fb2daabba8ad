"""The trainer-to-rollout weight channel over a real two-sided gloo group (two threads): the receiver ends with
the sender's exact tensors (parameters, buffers, several dtypes, in several buckets), a receiver whose model
differs makes both sides fail with the same line instead of waiting on each other, and the backend follows where
the two sides hold their weights."""

from __future__ import annotations

import threading

import pytest
import torch

from ript.errors import RiptError
from ript.utils.weight_sync import Endpoint, WeightChannel, buckets, channel_backend, first_difference, signature


class Small(torch.nn.Module):
    def __init__(self, width: int = 8, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(4, width)
        self.norm = torch.nn.BatchNorm1d(width)
        self.norm.running_mean.normal_()
        self.scale_bf16 = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16))
        self.register_buffer("steps", torch.tensor([seed], dtype=torch.long))


def exchange(sender: torch.nn.Module, receiver: torch.nn.Module, bucket_bytes: int) -> dict[str, object]:
    """One transfer between two threads: each side's bytes sent or its error."""
    store = WeightChannel.listen("127.0.0.1", 30)
    out: dict[str, object] = {}

    def receive():
        try:
            channel = WeightChannel(WeightChannel.connect("127.0.0.1", store.port, 30), 1, 30,
                                    bucket_bytes=bucket_bytes)
            out["receiver"] = channel.transfer(receiver)
        except RiptError as e:
            out["receiver"] = e

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        out["sender"] = WeightChannel(store, 0, 30, bucket_bytes=bucket_bytes).transfer(sender)
    except RiptError as e:
        out["sender"] = e
    thread.join(60)
    assert not thread.is_alive(), "the receiver is still waiting"
    return out


@pytest.mark.parametrize("bucket_bytes", [2**20, 40])  # one bucket per dtype; several of float32
def test_the_receiver_ends_with_the_senders_exact_tensors(bucket_bytes):
    sender, receiver = Small(seed=0), Small(seed=1)
    before = {k: v.clone() for k, v in receiver.state_dict().items()}
    out = exchange(sender, receiver, bucket_bytes)
    assert out["sender"] == out["receiver"] == sum(t.numel() * t.element_size() for t in before.values())
    for (name, a), b in zip(sender.state_dict().items(), receiver.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert int(receiver.steps) == 0  # the sender's buffer, not the receiver's own
    assert not torch.equal(before["linear.weight"], receiver.linear.weight)  # it really changed


def test_a_receiver_with_another_model_stops_both_sides_with_one_line():
    out = exchange(Small(width=8), Small(width=16), 2**20)
    assert isinstance(out["sender"], RiptError) and str(out["sender"]) == str(out["receiver"])
    assert "holds linear.weight as torch.float32 [16, 4], the sender as torch.float32 [8, 4]" in str(out["sender"])
    assert "\n" not in str(out["sender"])


def test_buckets_keep_one_dtype_and_the_size_limit_in_travel_order():
    f32 = [torch.zeros(4), torch.zeros(4), torch.zeros(10)]  # 16, 16, 40 bytes
    half = [torch.zeros(2, dtype=torch.bfloat16)]
    runs = buckets([f32[0], half[0], f32[1], f32[2]], bucket_bytes=32)
    assert [[id(t) for t in run] for run in runs] == [[id(f32[0]), id(f32[1])], [id(f32[2])], [id(half[0])]]


def test_the_backend_is_nccl_only_between_two_gpus():
    trainer, apart, same, cpu = Endpoint("a", 0), Endpoint("a", 1), Endpoint("a", 0), Endpoint("a", None)
    assert channel_backend("auto", trainer, apart) == "nccl"
    assert channel_backend("auto", trainer, Endpoint("b", 0)) == "nccl"  # GPU 0 of another node
    assert channel_backend("auto", trainer, same) == channel_backend("auto", cpu, cpu) == "gloo"
    assert channel_backend("gloo", trainer, apart) == "gloo"
    with pytest.raises(RiptError, match="weight_backend=nccl: the trainer and its rollout actor hold the weights "
                                        "on the same GPU"):
        channel_backend("nccl", trainer, same)
    with pytest.raises(RiptError, match="weight_backend=mpi: one of auto, gloo, nccl"):
        channel_backend("mpi", trainer, apart)


def test_signatures_name_the_first_difference():
    a, b = signature(Small()), signature(Small())
    assert first_difference(a, b) is None
    assert "has no tensor scale_bf16" in first_difference(a, [s for s in b if s.name != "scale_bf16"])
    assert "tensors the sender does not: extra" in first_difference(a, b + [b[0].__class__("extra", (1,), "x")])
    assert first_difference(a, list(reversed(b))) == "holds the same tensors in another order"
