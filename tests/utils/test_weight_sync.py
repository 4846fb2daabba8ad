"""Weight sync over a real two-process gloo group: the receiver ends with the sender's exact tensors (parameters,
buffers, several dtypes), and a receiver whose model differs makes both processes fail with the same line instead
of waiting on each other."""

from __future__ import annotations

import io
import multiprocessing as mp
import traceback

import torch

from ript.errors import RiptError


class Small(torch.nn.Module):
    def __init__(self, width: int = 8, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(4, width)
        self.norm = torch.nn.BatchNorm1d(width)
        self.norm.running_mean.normal_()
        self.scale_bf16 = torch.nn.Parameter(torch.randn(3, dtype=torch.bfloat16))
        self.register_buffer("steps", torch.tensor([seed], dtype=torch.long))


def _rank(rank: int, init: str, width: int, results) -> None:
    import torch.distributed as dist

    from ript.utils.weight_sync import sync_weights

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        model = Small(width=width if rank == 1 else 8, seed=rank)
        sent = sync_weights(model, src=0, verify=True)
        state = io.BytesIO()  # as bytes: a tensor put on a queue lives in the exiting process's shared memory
        torch.save(model.state_dict(), state)
        results.put((rank, "ok", sent, state.getvalue()))
    except RiptError as e:
        results.put((rank, "error", str(e), None))
    except Exception:
        results.put((rank, "crash", traceback.format_exc(), None))
    finally:
        dist.destroy_process_group()


def run_pair(tmp_path, receiver_width: int) -> dict:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=_rank, args=(r, init, receiver_width, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, status, detail, state = results.get(timeout=120)  # a hang fails here instead of waiting forever
        out[rank] = (status, detail, torch.load(io.BytesIO(state)) if state is not None else None)
    for p in procs:
        p.join(30)
    return out


def test_the_receiver_ends_with_the_senders_exact_tensors(tmp_path):
    out = run_pair(tmp_path, receiver_width=8)
    assert out[0][0] == out[1][0] == "ok", out
    sender, receiver = out[0][2], out[1][2]
    assert list(sender) == list(receiver)
    for name in sender:
        assert sender[name].dtype == receiver[name].dtype and torch.equal(sender[name], receiver[name]), name
    assert int(receiver["steps"]) == 0  # rank 0's buffer, not rank 1's own
    fresh = Small(seed=1).state_dict()
    assert not torch.equal(fresh["linear.weight"], receiver["linear.weight"])  # it really changed
    assert out[1][1] == sum(t.numel() * t.element_size() for t in fresh.values())


def test_a_receiver_with_another_model_stops_both_sides_with_one_line(tmp_path):
    out = run_pair(tmp_path, receiver_width=16)
    assert out[0][0] == out[1][0] == "error", out
    message = out[0][1]
    assert message == out[1][1] and "\n" not in message
    assert "rank 1 holds linear.weight as torch.float32 [16, 4], the sender as torch.float32 [8, 4]" in message


def test_signatures_name_the_first_difference():
    from ript.utils.weight_sync import first_difference, signature

    a, b = signature(Small()), signature(Small())
    assert first_difference(a, b) is None
    assert "has no tensor scale_bf16" in first_difference(a, [s for s in b if s.name != "scale_bf16"])
    assert "tensors the sender does not: extra" in first_difference(a, b + [b[0].__class__("extra", (1,), "x")])
    assert first_difference(a, list(reversed(b))) == "holds the same tensors in another order"
