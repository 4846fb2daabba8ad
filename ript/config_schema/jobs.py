"""One schema per job (``configs/<job>.yaml`` as composed), built from the sections."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from ript.config_schema.sections import (
    RL,
    Algo,
    Count,
    Data,
    Environment,
    EvalEvery,
    EvalEveryKeepBest,
    EvalProtocol,
    FlowAlgo,
    Placement,
    Policy,
    Rate,
    Sampling,
    Scale,
    Section,
    Seed,
    Size,
    Task,
    TaskList,
    Train,
    WorkerLimits,
    Workers,
    WorldModelAlgo,
)


class Job(Section):
    seed: Seed


class RunJob(Job):
    run_dir: str
    device: str
    resume: bool
    resume_allow_changes: list[str] = []
    resume_fewer_ranks: bool = False  # a checkpoint of N processes may continue on fewer (not an exact resume)
    compile_cache: str | None = None  # another run's compiled kernels (ript/utils/compile_cache.py)

    @field_validator("compile_cache")
    @classmethod
    def existing_file(cls, path: str | None) -> str | None:
        if path is not None and not Path(path).is_file():
            raise ValueError("not an existing file (a run folder's compile_cache.bin)")
        return path


class CollectJob(Job):
    task: Task
    noise: Scale | None
    filter_success: bool
    num_workers: Workers
    episodes_per_job: Count


class ExportJob(Job):
    task: Task
    out: str
    codec: str
    crf: Annotated[int, Field(ge=0, le=63)]
    robot_type: str | None


class EmbedJob(Section):
    task: Task


class ImportJob(Job):
    src: str
    data_dir: str


class Stage0Job(RunJob):
    task: Task
    algo: Algo
    train: Train
    data: Data
    progress: bool


class Stage1Job(Stage0Job):
    eval: EvalEveryKeepBest
    workers: WorkerLimits


class FlowJob(Stage1Job):
    algo: FlowAlgo
    init_checkpoint: str | None = None
    train_expert_only: bool = False


class NoEval(Section):
    every: Literal[0]


class WorldModelJob(Stage0Job):
    algo: WorldModelAlgo
    eval: NoEval
    init_checkpoint: str | None = None


class WorldModelEvalJob(Section):
    checkpoint: str
    out_dir: str | None
    overwrite: bool
    device: str
    seed: Seed
    split: Literal["val", "train", "all"]
    episodes_dir: str | None
    horizon_chunks: Count
    starts_per_demo: Count
    denoise_steps: Count | None = None
    success_threshold: Annotated[float, Field(gt=0, lt=1)]
    speed_envs: Count
    speed_chunks: Count
    n_videos: Size


class WorldModelHeadJob(Section):
    checkpoint: str
    run_dir: str
    resume: bool
    episodes_dirs: list[str]
    denoise_steps: Count | None = None
    device: str
    seed: Seed
    steps: Count
    batch_size: Count
    lr: Rate
    ignore_chunks: Size
    episodes_per_batch: Count


class RLEval(EvalEvery):
    sampling: Sampling    # the in-training evaluation's decoding; null keys: RL's own


class RLJob(RunJob):
    policy: Policy
    environment: Environment
    task_names: TaskList = None
    rl: RL
    eval: RLEval
    sampling: Sampling
    keep_last: Size | None
    workers: WorkerLimits
    placement: Placement = Placement()


class OFTJob(RLJob):
    task: Task
    eval: EvalEvery
    sampling: Sampling | None = None


class EvalJob(EvalProtocol):
    policy: Policy
    environment: Environment
    task_names: TaskList = None
    checkpoint: str
    out_dir: str | None
    overwrite: bool
    record_episodes: bool = False
    draws_per_layout: Count = 1
    calibrate_against: str | None = None
    device: str
    sampling: Sampling
    workers: WorkerLimits


class QuickStage(Section):
    steps: Count
    batch_size: Count
    lr: Rate


class QuickstartJob(Section):
    task: Task
    run_root: str
    stage0: QuickStage
    stage1: QuickStage
    eval_episodes: Count


class ProtocolJob(Section):
    task: Task
    name: str
    run_root: str
    gpus: Workers         # the GPUs a training phase may use
    min_batch_per_gpu: Count | None  # a training phase's global batch per GPU at least this (null: every GPU)
    base_checkpoint: str | None
    evaluate: Literal["last", "best"]
    phases: dict[str, dict[str, Any] | None]  # each phase's job config overrides; null: skipped


SCHEMAS: dict[str, type[BaseModel]] = {
    "collect": CollectJob, "stage0": Stage0Job, "stage1": Stage1Job, "finetune": Stage1Job, "flow": FlowJob,
    "world_model": WorldModelJob, "world_model_eval": WorldModelEvalJob,
    "world_model_head": WorldModelHeadJob, "rl": RLJob,
    "oft": OFTJob, "eval": EvalJob, "quickstart": QuickstartJob, "export": ExportJob, "import": ImportJob,
    "embed": EmbedJob,
    "protocol": ProtocolJob,
}
