import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.helpers.cli import rl_overrides


def _cfg(setting="auto", mode="collocated"):
    return OmegaConf.create({"rl": {"compile_ahead": setting}, "placement": {"mode": mode}})


def test_the_update_is_compiled_ahead_only_in_a_fresh_run_that_compiles_it_and_under_torchrun_when_asked():
    from ript.rl.compile_ahead import wanted

    assert wanted(_cfg(), compiles_update=True, world_size=1, cache_loaded=False)
    assert not wanted(_cfg(False), compiles_update=True, world_size=1, cache_loaded=False)
    assert not wanted(_cfg(), compiles_update=False, world_size=1, cache_loaded=False)
    assert not wanted(_cfg(), compiles_update=True, world_size=2, cache_loaded=False)
    assert wanted(_cfg(True), compiles_update=True, world_size=2, cache_loaded=False)
    assert not wanted(_cfg(True), compiles_update=True, world_size=2, cache_loaded=True)
    assert not wanted(_cfg(), compiles_update=True, world_size=1, cache_loaded=True)
    assert not wanted(_cfg(mode="disaggregated"), compiles_update=True, world_size=1, cache_loaded=False)
    assert not wanted(_cfg(True, mode="disaggregated"), compiles_update=True, world_size=2, cache_loaded=False)


@pytest.mark.extended
def test_the_first_update_finds_what_the_second_process_compiled(stage1_run, tmp_path):
    """Compiled on the CPU (Inductor's C++ kernels) into empty compiler caches: the second process compiles the
    update while the run rolls out, and the run's first update then compiles nothing itself. (Under torchrun,
    ``rl.compile_ahead=true``, each rank starts its own the same way: 2-3 minutes of compiling on this CPU, so
    not run here.)"""
    caches = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    cmd = [sys.executable, "-m", "ript.cli", "rl", *rl_overrides(stage1_run, tmp_path / "rl", 1),
           "device=cpu", "rl.compile=true", "rl.micro_batch=16", "rl.compile_ahead=auto",
           "rl.compile_ahead_wait_s=600"]  # a loaded 2-core host is slow
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **caches, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rl: the update compiled ahead in" in proc.stderr, proc.stderr[-3000:]
    assert "the run compiles it itself" not in proc.stderr, proc.stderr[-3000:]
    counts = re.findall(r"found (\d+) compiled graphs in the compiler's caches and compiled (\d+)", proc.stderr)
    assert len(counts) == 1 and int(counts[0][0]) >= 1 and int(counts[0][1]) == 0, proc.stderr[-3000:]
