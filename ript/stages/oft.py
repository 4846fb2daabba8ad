"""``ript oft-eval`` and ``ript oft-rl``: ``ript eval`` and ``ript rl`` with the ``oft`` job's config
(``configs/oft.yaml``: RL's, with ``policy=openvla_oft``, a LIBERO task and ``adapter=``), kept as shorthands for
an official OpenVLA-OFT or OpenVLA folder. The folder tells which it is.

    ript oft-eval checkpoint=<official folder> task=libero_spatial
    ript oft-rl checkpoint=<official folder> task=libero_spatial run_dir=runs/oft_rl
    ript oft-eval adapter=runs/oft_rl task=libero_spatial   # after RL (the base folder is the one RL started from)
"""

from __future__ import annotations

from ript.stages import evaluate, rl


def run_eval(cfg) -> dict:
    """The evaluation settings under ``eval:``, where RL's config keeps them."""
    return evaluate.evaluate(cfg, cfg.eval)


def run_rl(cfg) -> str:
    return rl.run(cfg)
