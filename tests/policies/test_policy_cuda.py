"""The CUDA-graph policy path against the eager one (runs where a GPU is present, e.g. the device host)."""

import numpy as np
import pytest
import torch

from ript.models.prior import SkillPrior
from ript.policies.chunk_policy import ChunkPolicy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

AE = dict(action_dim=4, chunk_size=16, downsample=4, dim=32, n_head=2, enc_layers=1, dec_layers=1, dropout=0.0)


def policies():
    torch.manual_seed(0)
    prior = SkillPrior(autoencoder=AE, task_names=["a", "b"], image_keys=["cam_rgb"], lowdim_dims={"state": 3},
                       lang_dim=8, frame_stack=2, dim=32, n_layer=2, n_head=2, dropout=0.0, encoder_width=8,
                       num_kp=4)
    return [ChunkPolicy(prior, action_horizon=4, temperature=1.0, top_k=5, device="cuda", seed=7, record=True,
                        cuda_graph=graph) for graph in (False, True)]


def test_graphed_plan_matches_eager_and_sees_weight_updates():
    rng = np.random.default_rng(0)
    frames = [{"cam_rgb": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
               "state": rng.normal(size=3).astype(np.float32)} for _ in range(5)]
    eager, graphed = policies()
    for _update in range(2):
        planned = []
        for p in (eager, graphed):
            p.reset(5)
            for i in range(5):
                p.reset_env(i, "ab"[i % 2], i)
                p.observe(i, frames[i])
            planned.append({**dict(zip([0, 2, 3], p.plan([0, 2, 3]))),  # fewer envs than the graph's batch:
                            **dict(zip([1, 4], p.plan([1, 4])))})       # padded rows must not leak
        assert graphed.graphs, "the graph path was not taken"
        for i in range(5):
            a, b = eager.take_record(i), graphed.take_record(i)
            assert len(a) == len(b) == 1
            assert torch.equal(a[0]["tokens"], b[0]["tokens"])
            assert torch.allclose(a[0]["log_probs"], b[0]["log_probs"], atol=1e-4)
            assert np.allclose(planned[0][i], planned[1][i], atol=1e-4)
        with torch.no_grad():  # an in-place update (as an optimiser does) must reach the captured graph
            eager.model.head.bias.add_(torch.linspace(-3, 3, eager.model.head.bias.numel(), device="cuda"))


def test_compiled_rl_update_with_accumulating_micro_batches_matches_eager():
    """rl.compile on CUDA: micro-batches padded to a static size and replayed as CUDA graphs accumulate into the
    same update as the eager scorer (a gradient adopted from a graph's output would be overwritten by the next
    micro-batch's replay)."""
    from ript.config import compose
    from ript.rl.learners import ChunkLearner
    from ript.rl.update import ppo_update
    from ript.utils.distributed import DistInfo

    g = torch.Generator().manual_seed(0)
    prior = policies()[0].model
    tokens = AE["chunk_size"] // AE["downsample"]
    n = 11  # three micro-batches of 4, the last one padded
    data = {"obs": {"cam_rgb": torch.randint(0, 256, (n, 2, 32, 32, 3), dtype=torch.uint8, generator=g).cuda(),
                    "state": torch.randn(n, 2, 3, generator=g).cuda()},
            "task_ids": torch.randint(0, 2, (n,), generator=g).cuda(),
            "tokens": torch.randint(0, prior.vocab_size, (n, tokens), generator=g).cuda(),
            "old_log_probs": (-3 * torch.rand(n, tokens, generator=g)).cuda(),
            "advantages": torch.linspace(-1, 1, n).cuda()}
    cfg = compose("rl", ["checkpoint=x", "rl.epochs=2", "rl.minibatches=1", "rl.micro_batch=4", "amp=false"])
    before = {k: v.clone() for k, v in prior.state_dict().items()}
    after = []
    for compiled in (False, True):
        prior.load_state_dict(before)
        learner = ChunkLearner(prior, {"temperature": 1.0, "top_k": None}, prior_only=False,
                               static_batch=4 if compiled else None, compile_scoring=compiled)
        opt = torch.optim.SGD(learner.params, lr=1.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 1.0)
        ppo_update(learner, opt, sched, data, cfg, DistInfo(), 0, "cuda")
        after.append({k: v.clone() for k, v in prior.state_dict().items()})
    moved = [k for k in before if not torch.equal(after[0][k], before[k])]
    assert moved
    assert max((after[0][k] - after[1][k]).abs().max().item() for k in moved) < 1e-3


def test_a_dataset_in_host_memory_delivers_the_same_batches_to_the_gpu(tmp_path):
    """data.on_device=auto keeps a dataset too large for the GPU in host memory: batches gathered there and
    copied from pinned memory equal those of the dataset moved to the GPU."""
    from test_dataset import spec, write_synthetic

    from ript.data.dataset import ChunkDataset

    files = [write_synthetic(tmp_path / "a.hdf5"), write_synthetic(tmp_path / "b.hdf5", lengths=(4,))]
    on_gpu, served = ChunkDataset(spec(files), "all").to("cuda"), ChunkDataset(spec(files), "all").serve_to("cuda")
    assert served.actions.device.type == "cpu" and served.device.type == "cuda"
    for idx in (torch.tensor([0, 3, 5, 12, 15]), torch.tensor([15, 1]).cuda()):
        a, b = on_gpu.get_batch(idx), served.get_batch(idx)
        for k in ("actions", "action_mask", "task_ids"):
            assert b[k].device.type == "cuda" and torch.equal(a[k], b[k])
        assert all(torch.equal(a["obs"][k], b["obs"][k]) for k in a["obs"])
