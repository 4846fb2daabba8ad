"""The ``ript`` command: one subcommand per job, each taking trailing hydra overrides.

    ript collect task=metaworld_ml45 task.demos_per_task=50
    ript stage1 task=metaworld_ml45 algo.prior.n_layer=4
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import typer

from ript.errors import RiptError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="ript: staged imitation-to-RL for robot manipulation. Trailing args are hydra overrides.")

OVERRIDES = typer.Argument(None, help="hydra overrides, e.g. task=metaworld_ml45 train.steps=100")


def _run(config_name: str, overrides: Optional[list[str]], fn: Callable) -> None:
    from ript.config import compose

    try:
        fn(compose(config_name, overrides))
    except RiptError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted; resume with resume=true", err=True)
        raise typer.Exit(130)


def _show(cfg) -> None:
    from omegaconf import OmegaConf

    typer.echo(OmegaConf.to_yaml(cfg))


@app.command()
def collect(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Scripted-expert demonstrations into one HDF5 file per task."""
    from ript.stages.collect import run

    _run("collect", overrides, run)


@app.command()
def stage0(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Train the action autoencoder."""
    from ript.stages.stage0 import run

    _run("stage0", overrides, run)


@app.command()
def stage1(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Train the skill prior on a stage-0 checkpoint (stage0_checkpoint=...)."""
    from ript.stages.stage1 import run

    _run("stage1", overrides, run)


@app.command()
def finetune(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Few-shot fine-tuning of a stage-1 checkpoint on new tasks (checkpoint=...)."""
    from ript.stages.stage1 import run_finetune

    _run("finetune", overrides, run_finetune)


@app.command()
def rl(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """RL fine-tuning (leave-one-out PPO) of a chunk-policy checkpoint (checkpoint=...). Runs under torchrun too."""
    from ript.stages.rl import run

    _run("rl", overrides, run)


@app.command("oft-eval")
def oft_eval(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Evaluate an official OpenVLA-OFT checkpoint folder (checkpoint=..., task=libero_*), optionally with an RL adapter."""
    from ript.stages.oft import run_eval

    _run("oft", overrides, run_eval)


@app.command("oft-rl")
def oft_rl(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """RL fine-tuning of an OpenVLA-OFT checkpoint with LoRA and a Laplace head (checkpoint=..., task=...)."""
    from ript.stages.oft import run_rl

    _run("oft", overrides, run_rl)


@app.command("eval")
def evaluate(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Evaluate a checkpoint in the simulator (checkpoint=...)."""
    from ript.stages.evaluate import run

    _run("eval", overrides, run)


@app.command()
def quickstart(overrides: Optional[list[str]] = OVERRIDES) -> None:
    """collect -> stage0 -> stage1 -> eval on two MetaWorld tasks, then print the success table."""
    from ript.stages.quickstart import run

    _run("quickstart", overrides, run)


@app.command()
def config(name: str = typer.Argument(..., help="collect, stage0, stage1, finetune, rl, eval or quickstart"),
           overrides: Optional[list[str]] = OVERRIDES) -> None:
    """Print a composed config."""
    _run(name, overrides, _show)


def main() -> None:
    app(prog_name="ript")


if __name__ == "__main__":
    sys.exit(main())
