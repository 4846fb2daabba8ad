"""Which processes count as running when a killed run's leftovers are cleaned."""

import os
import subprocess
import sys

from ript.experts.collect import remove_stale_temporaries
from ript.utils.processes import process_is_running


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped yet: a zombie, as an orphaned worker is under an init that
    never reaps (``WNOWAIT`` waits for the exit and leaves the child unreaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    return proc


def test_a_zombie_is_not_running_and_its_temporaries_are_removed(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = _zombie()
    try:
        assert process_is_running(sleeper.pid)
        assert not process_is_running(zombie.pid)
        kept = tmp_path / f".task.shard00000.hdf5.{sleeper.pid}.tmp"
        left = tmp_path / f".task.shard00001.hdf5.{zombie.pid}.tmp"
        for path in (kept, left):
            path.write_bytes(b"half")
        remove_stale_temporaries(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]  # the live writer keeps its file
    finally:
        sleeper.kill()
        sleeper.wait()
        zombie.wait()
    assert not process_is_running(sleeper.pid)
