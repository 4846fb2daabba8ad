"""The config sections the jobs' schemas are made of: field types with their ranges, and one model per section."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

Count = Annotated[int, Field(gt=0)]
Size = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=0, lt=2**31)]
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
ColorJitter = Annotated[float, Field(ge=0, le=0.5, allow_inf_nan=False)]  # a jitter strength (ript/models/encoders.py)
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
    backend: Literal["processes", "ray"] = "processes"  # this host's processes, or Ray actors on a cluster's nodes
    ray_address: str | None = None  # backend=ray: null starts Ray here; auto or host:port joins a cluster
    pipeline_stages: Literal["auto"] | Count = "auto"  # groups of workers planned in turn (runner.py)
    decisions: Literal["lockstep", "as_ready"] = "lockstep"  # when a group's waiting workers are planned (runner.py)
    tasks_per_slot: Literal["auto"] | Count = "auto"  # built tasks an env slot keeps (auto: by the host's memory)
    host_sets: Count | None = None  # sets of env workers sharing the host's memory (null: this job's ranks there)
    render_gpus: list[Size] | None = None  # the host's GPUs the simulators render on (null: chosen, envs/gl.py)


def _gpu_share(value: float) -> float:
    if value > 1 and value != int(value):
        raise ValueError(f"{value}: a share of one GPU (at most 1) or a whole number of GPUs")
    return value


class Placement(Section):
    """RL's ``placement:``: where each rank's rollouts run (``ript.rl.placement``, whose registry checks the
    name before any model loads)."""
    mode: str = "collocated"
    # disaggregated: GPUs of each rank's rollout actor; a share of one (e.g. 0.5) puts it beside another's work
    rollout_gpus: Annotated[float, Field(ge=0, allow_inf_nan=False), AfterValidator(_gpu_share)] = 0
    # hybrid: the GPUs every rank's simulators render on (the rollout actors act on the others)
    env_gpus: list[Size] | None = None
    # disaggregated: how the trainer's weights reach its rollout actor (auto: NCCL between two GPUs, else gloo)
    weight_backend: Literal["auto", "gloo", "nccl"] = "auto"


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
    lr_scaling: Literal["none", "sqrt", "linear"] = "none"  # lr is the peak rate at lr_reference_batch
    lr_reference_batch: Count = 256
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
    ema_decay: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = None

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
    image_aug_color: ColorJitter = 0.0
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
    image_aug_color: ColorJitter = 0.0
    model: FlowModel


class WorldModelNet(Section):
    width: Count
    stages: Count
    cond_dim: Count
    success_weight: Rate
    motion_weight: Scale
    output: Literal["change", "warp", "diffusion", "warp_diffusion"] = "change"
    denoise_steps: Count = 3
    cond_noise: Scale = 0.0
    state_head: Literal["bottleneck", "dynamics"] = "bottleneck"
    feed_back: Literal["regressed", "drawn"] = "regressed"


class WorldModelAlgo(Section):
    chunk: Count
    unroll: Count
    frame_stack: Literal[1]
    state_steps: Size = 0
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
    # head: the threshold a head trained by `ript world-model-head` chose on its held-out episodes
    success_threshold: Annotated[float, Field(gt=0, lt=1)] | Literal["head"] = 0.5
    calibration: str | None = None  # world model: a folder of calibration.json, whose threshold replaces it
    min_calibrated_accuracy: Fraction = 0.6  # RL: refused below this calibrated balanced accuracy (0: never)
    min_task_calibrated_accuracy: Fraction = 0.0  # RL: only the tasks calibrated at least this well (0: all)
    max_order_p_value: Fraction = 0.05  # RL: refused when the model orders a start's episodes no better than chance
    denoise_steps: Count | None = None  # a denoising world model's calls per chunk (None: its own)
    refresh_every: Size = 0
    refresh_episodes: Count = 4
    refresh_steps: Count = 500
    starts: Literal["first_frames", "demo_frames"] = "first_frames"  # world model: where imagined episodes start
    start_chunks: Count = 8   # starts=demo_frames: an episode's most world-model chunks

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
    task_weighting_prior: bool
    advantage: str
    reward: Literal["sparse", "dense"]
    reward_scale: Rate
    gamma: Fraction
    gae_lambda: Fraction
    normalize_advantages: bool
    loss_aggregation: Literal["decisions", "episodes"] = "decisions"  # what weighs the same in PPO's mean
    clip_low: Annotated[float, Field(gt=0, lt=1)]
    clip_high: Rate
    clip_ratio_c: Annotated[float, Field(gt=1, allow_inf_nan=False)] | None  # dual clip needs c > 1
    entropy_coef: Scale
    kl_coef: Scale = 0.0  # KL penalty to the checkpoint RL started from
    target_kl: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None  # epochs end past this approx KL
    target_eval_shift: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None  # ... or this shift
    flow_matching_coef: Scale = 0.0  # advantage-weighted flow matching toward the executed chunks
    demo_coef: Scale = 0.0  # flow matching on the checkpoint's demos at every optimiser step
    demo_batch: Count = 64
    critic: Critic
    epochs: Count
    minibatches: Count
    lr: Rate
    weight_decay: Scale
    warmup_iterations: Size
    grad_clip: Rate
    micro_batch: Count | None = None
    compile: Auto
    compile_ahead: Auto = "auto"
    compile_ahead_wait_s: Rate
    tf32: bool
    channels_last: bool
    recompute_old_log_probs: bool
    overlap: bool = False  # the next iteration's rollouts during this one's update (disaggregated placement)
    fsdp: bool = False  # the model that trains sharded over the trainer ranks (disaggregated placement)
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
