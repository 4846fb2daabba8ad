"""The bad-input matrix: every input or fault a user can cause, through the real ``ript`` command.

    MUJOCO_GL=egl python -m benchmarks.bad_inputs [--out benchmarks/results/bad_inputs.json]

Builds a tiny real setup in a temporary folder (MetaWorld, 2 tasks x 3 demos, stage 0 and stage 1 for a few
steps), then runs each case and prints a table: case, exit code, the first line of the error, OK. A case is
OK when the command exits as expected (2 with exactly one ``error:`` line holding the expected words and no
traceback, or 0 where the run must survive the fault) and what it must not touch is untouched. The read-only
and disk-full cases need to mount a tmpfs (root); elsewhere they are reported as skipped.

``matrix`` holds the setup and the bookkeeping; ``inputs`` the cases of bad values, files, checkpoints and
settings; ``faults`` those of runs, the filesystem, dead or hung workers and concurrent writers.
"""
