"""FSDP for the PPO update (``ript.utils.fsdp``, ``shard_learner``): OpenVLA-OFT fully fine-tuned with its layers
sharded over two gloo processes gives the weights of the same update in one process (the same decisions on both
ranks, whose averaged gradient is the one-process gradient); the gathered weights are whole tensors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

UPDATE = ["-m", "benchmarks.fsdp_update", "--tiny", "--device", "cpu", "--full", "--decisions", "8",
          "--overrides", "rl.micro_batch=4", "amp=false"]


def update(tmp_path, name: str, launcher: list[str], *extra: str) -> tuple[dict, dict[str, torch.Tensor]]:
    weights, out = tmp_path / f"{name}.safetensors", tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, *launcher, *UPDATE, "--folder", str(tmp_path / "oft"),
                           "--save-weights", str(weights), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), load_file(str(weights))


def test_a_sharded_update_gives_the_one_process_weights(tmp_path):
    one, whole = update(tmp_path, "one", [], "--no-fsdp")
    two, sharded = update(tmp_path, "two", ["-m", "torch.distributed.run", "--nproc_per_node", "2"])
    assert (one["ranks"], one["fsdp"], two["ranks"], two["fsdp"]) == (1, False, 2, True)
    assert two["grad_norm"] > 0 and abs(one["grad_norm"] - two["grad_norm"]) < 1e-3 * one["grad_norm"]
    assert sorted(whole) == sorted(sharded)
    for k in whole:
        assert whole[k].shape == sharded[k].shape, k  # gathered whole, not one rank's shard
        torch.testing.assert_close(sharded[k], whole[k], atol=1e-5, rtol=1e-5)


PI0 = ["-m", "benchmarks.pi0_rl_iteration", "--size", "tiny", "--device", "cpu", "--full", "--envs", "4", "--rounds",
       "2", "--steps", "2", "--micro-batch", "4", "--minibatches", "2", "--epochs", "1", "--methods", "flow_noise"]


@pytest.mark.extended
def test_pi0_sharded_gives_the_one_process_weights(tmp_path):
    """π0 (the tiny size, every weight training, Flow-Noise) sharded over two gloo processes: its Gemma layers run
    by a method of their own (``attend``), which the sharding gathers their weights around as around a forward."""
    runs = {}
    for name, launcher in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc_per_node", "2"])):
        proc = subprocess.run([sys.executable, *launcher, *PI0, "--fsdp", "--save-weights", str(tmp_path / name),
                               "--out", str(tmp_path / f"{name}.json")], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert (runs["one"]["fsdp"], runs["two"]["fsdp"], runs["two"]["ranks"]) == (False, True, 2)
    for one, two in zip(runs["one"]["iterations"], runs["two"]["iterations"], strict=True):
        assert two["grad_norm"] > 0 and abs(one["grad_norm"] - two["grad_norm"]) < 1e-4 * one["grad_norm"]
    whole, sharded = (load_file(str(tmp_path / f"{name}.flow_noise.safetensors")) for name in ("one", "two"))
    assert sorted(whole) == sorted(sharded) and any(k.startswith("prefix_layers.") for k in whole)
    for k in whole:
        torch.testing.assert_close(sharded[k], whole[k], atol=1e-5, rtol=1e-5)
