"""Typed schemas for every job's composed config: types and ranges, checked right after composition.

Hydra's struct mode already refuses unknown keys; these schemas refuse values out of range (a zero step count,
a probability of 1.5, an unknown enum) with one line naming the key, the value and what is allowed, before a
stage creates a folder or writes a file. Sections a schema does not list (model sizes a model checks itself,
logger settings) pass through unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from ript.errors import RiptError

Count = Annotated[int, Field(gt=0)]
Size = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=0, lt=2**31)]
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Scale = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Workers = Literal["auto"] | Count
Auto = Literal["auto"] | bool


def _task_list(names: list[str]) -> list[str]:
    if not names:
        raise ValueError("an empty list names no task; list the tasks, or null for every task")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} listed more than once; list each task once")
    return names


# An explicit task list: null means every task (of the benchmark or the checkpoint), [] would be ambiguous.
TaskList = Annotated[list[str], AfterValidator(_task_list)] | None


class Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class Render(Section):
    cameras: Annotated[list[str], Field(min_length=1)]
    image_size: Annotated[int, Field(ge=8, le=2048)]
    quality: Literal["low", "high"]


class Task(Section):
    name: str
    suite: str
    data_dir: str
    format: Literal["hdf5", "lerobot"] = "hdf5"  # lerobot: data_dir is a LeRobotDataset v3.0 folder
    demos_per_task: Count
    max_episode_steps: Count | None  # null: the suite's official horizon
    action_dim: Count
    expert_noise: Scale
    render: Render
    task_names: TaskList = None


class WorkerLimits(Section):
    timeout_s: Rate       # a worker silent for this long is killed and replaced
    max_restarts: Size    # replaced workers allowed per run before it fails
    envs_per_worker: Literal["auto"] | Count  # env slots per worker process (auto: the suite's choice)


class Sampling(Section):
    temperature: Rate | None = None
    top_k: Count | None = None
    greedy: bool | None = None
    action_horizon: Count | None = None


class EvalProtocol(Section):
    """configs/eval/protocol.yaml: ``ript eval``'s top level and every training stage's ``eval:`` block."""
    episodes_per_task: Count | None
    num_workers: Workers
    seed: Seed
    n_videos: Size
    max_episode_steps: Count | None


class EvalEvery(EvalProtocol):
    every: Size


class EvalEveryKeepBest(EvalEvery):
    keep_best: bool


class Train(Section):
    steps: Count
    batch_size: Count
    lr: Rate
    weight_decay: Scale
    warmup_steps: Size
    grad_clip: Rate
    amp: Auto
    compile: Auto
    cuda_graphs: bool
    channels_last: bool
    tf32: bool
    cudnn_benchmark: bool
    deterministic: bool
    log_every: Count
    val_every: Count
    save_every: Count
    keep_last: Size | None  # 0 or null: keep every checkpoint
    stop_after_minutes: Scale | None  # 0: stop after the first step

    @field_validator("deterministic")
    @classmethod
    def eager_when_deterministic(cls, deterministic: bool, info) -> bool:
        # two compiled stage-1 runs on CUDA differed in the last bits, deterministic kernels or not
        if deterministic and info.data.get("compile") is True:
            raise ValueError("identical reruns need the eager step: with train.deterministic=true leave "
                             "train.compile=auto (then eager) or set it false")
        return deterministic


class Data(Section):
    demos_per_task: Count | None
    val_fraction: Annotated[float, Field(ge=0, lt=1)]
    on_device: Auto
    action_key: Literal["actions", "expert_actions"] = "actions"


class Autoencoder(Section):
    dim: Count
    n_head: Count
    enc_layers: Count
    dec_layers: Count
    quantizer: Literal["fsq", "vq"]
    dropout: Annotated[float, Field(ge=0, lt=1)]


class Prior(Section):
    dim: Count
    n_layer: Count
    n_head: Count
    dropout: Annotated[float, Field(ge=0, lt=1)]
    num_kp: Count
    encoder_stages: Annotated[int, Field(ge=1, le=4)]


class Algo(Section):
    chunk_size: Count
    downsample: Count
    action_horizon: Count
    frame_stack: Count
    image_aug_pad: Size
    autoencoder: Autoencoder
    prior: Prior
    sampling: Sampling


class FlowModel(Section):
    dim: Count
    prefix_layers: Count
    expert_layers: Count
    n_head: Count
    dropout: Annotated[float, Field(ge=0, lt=1)]
    num_kp: Count
    encoder_stages: Annotated[int, Field(ge=1, le=4)]
    time_sampling: Literal["beta", "uniform"]


class FlowAlgo(Section):
    chunk_size: Count
    action_horizon: Count
    denoise_steps: Count
    frame_stack: Count
    image_aug_pad: Size
    model: FlowModel


class WorldModelNet(Section):
    width: Count
    stages: Count
    cond_dim: Count
    success_weight: Rate


class WorldModelAlgo(Section):
    chunk: Count
    unroll: Count
    frame_stack: Literal[1]
    model: WorldModelNet


class Critic(Section):
    hidden: Count
    detach_input: bool
    lr: Rate
    value_coef: Scale
    value_clip: Rate | None
    loss: Literal["huber", "mse"]
    huber_delta: Rate
    warmup_iterations: Size


class Environment(Section):
    """configs/environment/: where episodes run (RL's rollouts, ``ript eval``)."""
    name: str
    checkpoint: str | None = None
    envs: Count = 64
    success_threshold: Annotated[float, Field(gt=0, lt=1)] = 0.5
    refresh_every: Size = 0
    refresh_episodes: Count = 4
    refresh_steps: Count = 500

    @field_validator("name")
    @classmethod
    def registered(cls, name: str) -> str:
        from ript.evaluation import environments  # noqa: F401  (registers them)
        from ript.registry import ENVIRONMENTS

        if name not in ENVIRONMENTS.names():
            raise ValueError(f"expected one of {', '.join(ENVIRONMENTS.names())}")
        return name


class RL(Section):
    iterations: Count
    groups_per_iteration: Count
    rollouts_per_group: Count
    max_sampling_rounds: Count
    oversample: Literal["auto"] | Annotated[float, Field(ge=1, allow_inf_nan=False)]
    skip_mastered_for: Size
    ic_pool_size: Count
    task_weighting: Literal["uniform", "informative"]
    task_weighting_floor: Fraction
    advantage: str
    reward: Literal["sparse", "dense"]
    reward_scale: Rate
    gamma: Fraction
    gae_lambda: Fraction
    normalize_advantages: bool
    clip_low: Annotated[float, Field(gt=0, lt=1)]
    clip_high: Rate
    clip_ratio_c: Annotated[float, Field(gt=1, allow_inf_nan=False)] | None  # dual clip needs c > 1
    entropy_coef: Scale
    critic: Critic
    epochs: Count
    minibatches: Count
    lr: Rate
    weight_decay: Scale
    warmup_iterations: Size
    grad_clip: Rate
    micro_batch: Count | None = None
    compile: Auto
    tf32: bool
    channels_last: bool
    recompute_old_log_probs: bool
    max_episode_steps: Count | None
    num_workers: Workers
    stop_after_minutes: Scale | None  # 0: stop after the first step
    max_env_steps: Count | None
    video_every: Size  # iterations between recorded rollouts (0: none)

    @field_validator("advantage")
    @classmethod
    def registered(cls, name: str, info) -> str:
        from ript.registry import ADVANTAGES
        from ript.rl import advantages  # noqa: F401  (registers the estimators)

        if name not in ADVANTAGES.names():
            raise ValueError(f"expected one of {', '.join(ADVANTAGES.names())}")
        k = info.data.get("rollouts_per_group")
        if ADVANTAGES.get(name).needs_mixed_groups and k is not None and k < 2:
            raise ValueError(f"{name} compares the rollouts of a group: rl.rollouts_per_group={k} needs to be >= 2")
        return name


class Policy(Section):
    """configs/policy/: the family's name; its other keys are the family's own (checked where it reads them)."""
    name: str


class Job(Section):
    seed: Seed


class RunJob(Job):
    run_dir: str
    device: str
    resume: bool
    resume_allow_changes: list[str] = []


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
    horizon_chunks: Count
    starts_per_demo: Count
    success_threshold: Annotated[float, Field(gt=0, lt=1)]
    speed_envs: Count
    speed_chunks: Count
    n_videos: Size


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
    gpus: Workers         # processes per training phase
    base_checkpoint: str | None
    evaluate: Literal["last", "best"]
    phases: dict[str, dict[str, Any] | None]  # each phase's job config overrides; null: skipped


SCHEMAS: dict[str, type[BaseModel]] = {
    "collect": CollectJob, "stage0": Stage0Job, "stage1": Stage1Job, "finetune": Stage1Job, "flow": FlowJob,
    "world_model": WorldModelJob, "world_model_eval": WorldModelEvalJob, "rl": RLJob,
    "oft": OFTJob, "eval": EvalJob, "quickstart": QuickstartJob, "export": ExportJob, "import": ImportJob,
    "protocol": ProtocolJob,
}


_PLAIN_TAGS = {"int", "bool", "float", "str", "none"}


def _is_union_tag(part: Any) -> bool:
    """Pydantic names a union member in an error location: a plain type, or one with '[' or '-' in its name
    ("literal['auto']", "constrained-int"), neither of which a config key has."""
    return isinstance(part, str) and (part in _PLAIN_TAGS or "[" in part or "-" in part)


def _key(loc: tuple) -> str:
    """The config key of a pydantic error location, without the tags it adds for union members."""
    return ".".join(str(p) for p in loc if not _is_union_tag(p))


def validate(name: str, cfg: dict) -> None:
    """Raise a one-line RiptError for the first out-of-range value of job ``name``'s resolved config."""
    schema = SCHEMAS.get(name)
    if schema is None:
        return
    try:
        schema.model_validate(cfg)
    except ValidationError as e:
        errors = e.errors()
        key = _key(errors[0]["loc"])
        if errors[0]["type"] == "missing":
            raise RiptError(f"config {name}: key {key} is required") from None
        # a union (e.g. 'auto' or a positive count) reports one error per member: name them all
        messages = list(dict.fromkeys(err["msg"].removeprefix("Value error, ") for err in errors
                                      if _key(err["loc"]) == key))
        allowed = " or ".join(m[0].lower() + m[1:] for m in messages)
        raise RiptError(f"config {name}: {key}={errors[0].get('input')!r} is out of range: {allowed}") from None
