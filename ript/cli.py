"""The ``ript`` command: one subcommand per job, each taking trailing hydra overrides.

    ript collect task=metaworld_ml45 task.demos_per_task=50
    ript stage1 task=metaworld_ml45 algo.prior.n_layer=4
"""

from __future__ import annotations

import errno
import os
import re
import sys
import threading
from collections.abc import Callable

import typer

from ript.errors import RiptError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="ript: staged imitation-to-RL for robot manipulation. Trailing args are hydra overrides.")

OVERRIDES = typer.Argument(None, help="hydra overrides, e.g. task=metaworld_ml45 train.steps=100")


def describe_os_error(e: OSError) -> str:
    """One line for a filesystem error a user can cause and fix: the path and what to do."""
    path = e.filename or "a file"
    if e.errno == errno.ENOSPC or e.errno == errno.EDQUOT:
        where = f" while writing {e.filename}" if e.filename else ""
        return f"no space left on the device{where}; free space, or put run_dir/data_dir/out_dir on another disk"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {path}: {e.strerror} (read-only or not yours); choose a writable run_dir/out_dir/data_dir"
    if e.errno == errno.ENOTDIR:
        return f"{path}: part of this path is a file, not a folder; choose another path"
    if e.errno == errno.ENOENT:
        return f"{path} does not exist"
    if e.filename is None:  # e.g. h5py's errors: the message names the operation
        return (str(e).strip().splitlines() or [type(e).__name__])[0]
    return f"{path}: {e.strerror or e}"


def h5py_os_error(e: RuntimeError) -> OSError | None:
    """The OSError inside an HDF5 library error (h5py raises a failed write as RuntimeError, e.g. "Object copy
    failed (file write failed: ..., filename = '...', errno = 28, error message = 'No space left on device'...")."""
    found = re.search(r"errno = (\d+), error message = '([^']*)'", str(e))
    if found is None:
        return None
    name = re.search(r"filename = '([^']*)'", str(e))
    return OSError(int(found.group(1)), found.group(2), name.group(1) if name else None)


# How each job goes on after a Ctrl-C (``oft`` is two jobs: ``oft-rl`` resumes, ``oft-eval`` starts again).
CONTINUE = {
    "collect": "its finished jobs are kept: run the same command again to continue",
    "stage0": "continue from the last checkpoint with the same command and resume=true",
    "stage1": "continue from the last checkpoint with the same command and resume=true",
    "finetune": "continue from the last checkpoint with the same command and resume=true",
    "flow": "continue from the last checkpoint with the same command and resume=true",
    "world_model": "continue from the last checkpoint with the same command and resume=true",
    "world_model_eval": "no results were written: run the same command again to measure",
    "world_model_head": "nothing was saved: the same command with resume=true starts it again",
    "rl": "continue from the last checkpoint with the same command and resume=true",
    "eval": "no results were written (an evaluation does not resume): run the same command again to evaluate",
    "protocol": "its finished phases are kept: the same command continues from the phase it stopped in",
    "quickstart": "what it finished is kept: the same command continues where it stopped",
}


def how_to_continue(config_name: str, fn: Callable) -> str:
    parent = os.environ.get("RIPT_PHASE_OF")  # a protocol's phase: the protocol's own line follows
    if parent:
        return f"this job is a phase of the {parent}, which says how to continue"
    if config_name == "oft":
        config_name = "rl" if fn.__name__ == "run_rl" else "eval"
    return CONTINUE.get(config_name, "run the same command again")


def _run(config_name: str, overrides: list[str] | None, fn: Callable) -> None:
    """Compose the config and run the job; every failure a user can cause ends as one line and exit 2
    (tracebacks with RIPT_DEBUG=1 or --debug)."""
    from ript.config import compose
    from ript.envs.gl import check_render_environment

    debug = os.environ.get("RIPT_DEBUG") == "1"
    if not debug:  # a logging thread's disk error reaches the job on its next write; report it once, there
        threading.excepthook = _quiet_os_errors
    try:
        cfg = compose(config_name, overrides)
        check_render_environment()  # before a progress bar or a simulator: MuJoCo would fail in every worker
        fn(cfg)
    except KeyboardInterrupt:
        typer.echo(f"interrupted; {how_to_continue(config_name, fn)}", err=True)
        raise typer.Exit(130) from None
    except (RiptError, OSError, EOFError, RuntimeError) as e:
        if debug:
            raise
        if isinstance(e, RuntimeError):
            e = h5py_os_error(e) or e
            if not isinstance(e, OSError):  # not a file error: a bug to report with its traceback
                raise
        if isinstance(e, RiptError):
            message = str(e)
        elif isinstance(e, OSError):
            message = describe_os_error(e)
        else:
            message = "a child process ended unexpectedly; rerun with RIPT_DEBUG=1 for the traceback"
        typer.echo(f"error: {message}", err=True)
        raise typer.Exit(2) from None


def _with_checkpoint_policy(overrides: list[str] | None) -> list[str]:
    """The overrides with ``policy=<family>`` of the checkpoint's family when they name a checkpoint but no
    policy: a flow run or an official OpenVLA-OFT folder says itself what it holds."""
    given = list(overrides or [])
    keys = [o.split("=", 1)[0].lstrip("+~") for o in given]
    if "policy" in keys or "checkpoint" not in keys:
        return given
    from ript.policies.families import checkpoint_model
    from ript.registry import POLICIES

    path = given[keys.index("checkpoint")].split("=", 1)[1].strip("'\"")
    model = checkpoint_model(path) if path else None
    return [f"policy={model}", *given] if model in POLICIES.names() else given


def _quiet_os_errors(args) -> None:
    if not issubclass(args.exc_type, OSError):
        threading.__excepthook__(args)


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="show full tracebacks instead of one-line errors")):
    if debug:
        os.environ["RIPT_DEBUG"] = "1"


def _show(cfg) -> None:
    from omegaconf import OmegaConf

    typer.echo(OmegaConf.to_yaml(cfg))


@app.command()
def collect(overrides: list[str] | None = OVERRIDES) -> None:
    """Scripted-expert demonstrations into one HDF5 file per task."""
    from ript.stages.collect import run

    _run("collect", overrides, run)


@app.command()
def stage0(overrides: list[str] | None = OVERRIDES) -> None:
    """Train the action autoencoder."""
    from ript.stages.stage0 import run

    _run("stage0", overrides, run)


@app.command()
def stage1(overrides: list[str] | None = OVERRIDES) -> None:
    """Train the skill prior on a stage-0 checkpoint (stage0_checkpoint=...)."""
    from ript.stages.stage1 import run

    _run("stage1", overrides, run)


@app.command()
def flow(overrides: list[str] | None = OVERRIDES) -> None:
    """Train a flow-matching chunk policy on the task's demonstrations (algo=flow; no stage 0)."""
    from ript.stages.flow import run

    _run("flow", overrides, run)


@app.command("world-model")
def world_model(overrides: list[str] | None = OVERRIDES) -> None:
    """Train a world model of the task's suite on its demos (RL then runs in it: environment=world_model)."""
    from ript.stages.world_model import run

    _run("world_model", overrides, run)


@app.command("world-model-eval")
def world_model_eval(overrides: list[str] | None = OVERRIDES) -> None:
    """Measure a world model on its held-out demos: frame fidelity, its success head, imagined steps/s, videos."""
    from ript.stages.world_model_eval import run

    _run("world_model_eval", overrides, run)


@app.command("world-model-head")
def world_model_head(overrides: list[str] | None = OVERRIDES) -> None:
    """Train a world model's success head again on the model's own imagination of its episodes."""
    from ript.stages.world_model_head import run

    _run("world_model_head", overrides, run)


@app.command()
def finetune(overrides: list[str] | None = OVERRIDES) -> None:
    """Few-shot fine-tuning of a stage-1 checkpoint on new tasks (checkpoint=...)."""
    from ript.stages.stage1 import run_finetune

    _run("finetune", overrides, run_finetune)


@app.command()
def rl(overrides: list[str] | None = OVERRIDES) -> None:
    """RL fine-tuning (leave-one-out PPO) of a checkpoint (checkpoint=...; policy=openvla_oft|openvla with an
    official folder and task=...). Runs under torchrun too."""
    from ript.stages.rl import run

    _run("rl", _with_checkpoint_policy(overrides), run)


@app.command("oft-eval")
def oft_eval(overrides: list[str] | None = OVERRIDES) -> None:
    """`ript eval` with the oft config: an official OpenVLA-OFT or OpenVLA folder (checkpoint=..., task=libero_*),
    optionally with an RL adapter (adapter=...)."""
    from ript.stages.oft import run_eval

    _run("oft", overrides, run_eval)


@app.command("oft-rl")
def oft_rl(overrides: list[str] | None = OVERRIDES) -> None:
    """`ript rl` with the oft config: LoRA on an OpenVLA-OFT folder (Laplace head) or an OpenVLA one (its bins)."""
    from ript.stages.oft import run_rl

    _run("oft", overrides, run_rl)


@app.command("export")
def export(overrides: list[str] | None = OVERRIDES) -> None:
    """A task's demonstrations as a LeRobotDataset v3.0 folder: ript export task=... out=<folder>."""
    from ript.stages.lerobot_io import run_export

    _run("export", overrides, run_export)


@app.command("import")
def import_(overrides: list[str] | None = OVERRIDES) -> None:
    """A LeRobotDataset v3.0 folder back to HDF5 files: ript import src=<folder> data_dir=<folder>."""
    from ript.stages.lerobot_io import run_import

    _run("import", overrides, run_import)


@app.command()
def embed(overrides: list[str] | None = OVERRIDES) -> None:
    """The task instructions' embeddings into the language cache, for a host without the encoder."""
    from ript.stages.embed import run

    _run("embed", overrides, run)


@app.command("eval")
def evaluate(overrides: list[str] | None = OVERRIDES) -> None:
    """Evaluate a checkpoint in the simulator (checkpoint=...; policy=openvla_oft|openvla with task=...)."""
    from ript.stages.evaluate import run

    _run("eval", _with_checkpoint_policy(overrides), run)


@app.command()
def protocol(name: str = typer.Argument(..., help="ml45_multitask, ml45_fewshot, libero_object, libero_spatial, "
                                                  "libero_goal (configs/protocol/)"),
             overrides: list[str] | None = OVERRIDES) -> None:
    """A reference protocol end to end: demonstrations, stages 0-1 (or few-shot fine-tuning), evaluation, RL,
    evaluation; per-task table and results.json. Rerun the same command to continue an interrupted one."""
    from ript.stages.protocol import protocol_names, run

    if name not in protocol_names():
        typer.echo(f"error: unknown protocol {name!r}; choose one of {', '.join(protocol_names())}", err=True)
        raise typer.Exit(2) from None
    _run("protocol", [f"protocol={name}", *(overrides or [])], run)


@app.command()
def quickstart(overrides: list[str] | None = OVERRIDES) -> None:
    """collect -> stage0 -> stage1 -> eval on two MetaWorld tasks, then print the success table."""
    from ript.quickstart import run

    _run("quickstart", overrides, run)


@app.command()
def config(name: str = typer.Argument(..., help="collect, stage0, stage1, finetune, rl, eval or quickstart"),
           overrides: list[str] | None = OVERRIDES) -> None:
    """Print a composed config."""
    _run(name, overrides, _show)


def main() -> None:
    from ript.utils.processes import stacks_on_signal

    stacks_on_signal()
    app(prog_name="ript")


if __name__ == "__main__":
    sys.exit(main())
