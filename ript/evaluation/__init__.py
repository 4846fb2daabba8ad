"""Evaluation: the env runner built from a checkpoint's metadata and one evaluation of a policy (``runner``), and
what an evaluation leaves behind: summaries, the success table, results files and pictures (``results``)."""
