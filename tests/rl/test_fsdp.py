"""FSDP for the PPO update (``ript.utils.fsdp``, ``shard_learner``): OpenVLA-OFT fully fine-tuned with its layers
sharded over two gloo processes gives the weights of the same update in one process (the same decisions on both
ranks, whose averaged gradient is the one-process gradient); the gathered weights are whole tensors."""

from __future__ import annotations

import json
import subprocess
import sys

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
