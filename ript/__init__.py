"""ript: a staged imitation-to-RL pipeline for robot manipulation."""

__version__ = "0.1.0"
