"""A run keeps what torch.compile built in its folder; a process with an empty compiler cache (a fresh host) that
loads the file compiles nothing again. The compiled function is a matrix product, which Inductor hands to an
external kernel: no C++ to build on the CPU, so each process compiles in about a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ript.errors import RiptError
from ript.utils.compile_cache import CACHE_FILE, CompileCache

COMPILE_ONCE = """
import json, sys, torch
from torch._dynamo.utils import counters
from ript.utils.compile_cache import CompileCache
cache = CompileCache(sys.argv[1], sys.argv[2] or None, is_main=True)
product = torch.compile(lambda x, w: torch.mm(x, w))
product(torch.ones(4, 4), torch.ones(4, 4))
cache.save()
print(json.dumps(dict(counters["inductor"])))
"""


def compile_in_fresh_process(run_dir, given, compiler_cache) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(compiler_cache)}  # empty: as on a host never used
    out = subprocess.run([sys.executable, "-c", COMPILE_ONCE, str(run_dir), str(given or "")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_run_keeps_what_it_compiled_and_a_fresh_process_starts_from_it(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    counts = compile_in_fresh_process(first, None, tmp_path / "compiler_a")
    assert counts.get("fxgraph_cache_miss") == 1 and (first / CACHE_FILE).stat().st_size > 0
    # another run started from the first one's file, on an empty compiler cache
    counts = compile_in_fresh_process(second, first / CACHE_FILE, tmp_path / "compiler_b")
    assert counts.get("fxgraph_cache_hit") == 1 and "fxgraph_cache_miss" not in counts
    # the first run resumed on yet another empty compiler cache: its own file
    counts = compile_in_fresh_process(first, None, tmp_path / "compiler_c")
    assert counts.get("fxgraph_cache_hit") == 1 and "fxgraph_cache_miss" not in counts


def test_a_named_cache_that_is_not_one_is_one_line_and_the_runs_own_is_replaced(tmp_path, monkeypatch):
    from ript.utils import compile_cache

    said = []
    monkeypatch.setattr(compile_cache.log, "warning", lambda message, *args: said.append(message % args))
    bad = tmp_path / "elsewhere.bin"
    bad.write_bytes(b"not a cache")
    with pytest.raises(RiptError, match=rf"compile_cache={bad}: not a compile cache") as e:
        CompileCache(tmp_path, str(bad), is_main=True)
    assert "\n" not in str(e.value)
    with pytest.raises(RiptError, match="no such file"):
        CompileCache(tmp_path, str(tmp_path / "missing.bin"), is_main=True)
    (tmp_path / CACHE_FILE).write_bytes(b"torn")
    CompileCache(tmp_path, None, is_main=True)  # the run's own file: a warning, and the run compiles afresh
    assert said == [f"{tmp_path / CACHE_FILE} is not a compile cache; this run compiles afresh and replaces it"]
    assert (tmp_path / CACHE_FILE).read_bytes() == b"torn"
