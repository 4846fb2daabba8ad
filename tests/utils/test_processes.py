"""Which processes count as running when a killed run's leftovers are cleaned."""

import subprocess
import sys
import time

from ript.experts.collect import remove_stale_temporaries
from ript.utils.processes import process_is_running


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped yet: a zombie, as an orphaned worker is under an init that
    never reaps."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return proc
        time.sleep(0.02)
    raise AssertionError(f"process {proc.pid} did not exit")


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
