"""Pieces of every training step: the optimiser and its schedule, bf16 autocast, compiled losses, and one
guarded optimiser step (non-finite losses stop the run before the weights change). The run around the steps
(resume, checkpoints, time limit, logging) is ``ript.utils.trainer``."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable

import torch

from ript.errors import RiptError
from ript.utils.distributed import DistInfo, average_gradients
from ript.utils.logging import log

LR_SCALING = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}  # the exponent of batch_size / lr_reference_batch


def train_only(model: torch.nn.Module, params) -> None:
    """Only ``params`` of ``model`` train: the rest stops requiring grad, so the optimiser never sees it."""
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)


def peak_lr(train_cfg) -> float:
    """``train.lr`` scaled from ``train.lr_reference_batch`` samples to ``train.batch_size`` by the rule of
    ``train.lr_scaling`` (a larger batch averages away noise, so the same step can be taken larger)."""
    exponent = LR_SCALING[str(train_cfg.get("lr_scaling", "none"))]
    ratio = int(train_cfg.batch_size) / int(train_cfg.get("lr_reference_batch", train_cfg.batch_size))
    return float(train_cfg.lr) * ratio ** exponent


def make_optimizer(params, train_cfg, total_steps: int, device: str):
    params = [p for p in params if p.requires_grad]
    lr = peak_lr(train_cfg)
    if lr != float(train_cfg.lr):
        log.info("train: peak lr %.3g (train.lr %.3g at %d samples, %s scaling to %d)", lr, float(train_cfg.lr),
                 int(train_cfg.lr_reference_batch), train_cfg.lr_scaling, int(train_cfg.batch_size))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=train_cfg.weight_decay, betas=(0.9, 0.95),
                            fused=device.startswith("cuda"))
    warmup = max(0, int(train_cfg.warmup_steps))

    def schedule(step: int) -> float:  # linear warm-up, then cosine to 10% of the peak rate
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def autocast(device: str, amp: str | bool):
    enabled = device.startswith("cuda") if amp == "auto" else bool(amp)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def fast_math(device: str, train_cfg) -> None:
    """Process-wide CUDA math settings for training: TF32 matmuls (convolutions use TF32 by default already),
    if asked cuDNN autotuning (faster convolutions, but its algorithm choice can differ between runs), and
    ``train.deterministic``: only kernels that give the same bits every run (GPU kernels that add with atomics,
    e.g. some attention and embedding backward passes, do not), so reruns and resumes match exactly."""
    if not device.startswith("cuda"):
        return
    torch.backends.cuda.matmul.allow_tf32 = bool(train_cfg.tf32)
    torch.backends.cudnn.allow_tf32 = bool(train_cfg.tf32)
    deterministic = bool(train_cfg.deterministic)
    torch.backends.cudnn.benchmark = bool(train_cfg.cudnn_benchmark) and not deterministic
    torch.backends.cudnn.deterministic = deterministic
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS makes its first handle
    torch.use_deterministic_algorithms(deterministic)  # an op with no deterministic kernel then fails by name


def prepare_model(model: torch.nn.Module, device: str, train_cfg) -> torch.nn.Module:
    """Channels-last weights on CUDA (images arrive as NHWC, so convolutions need no layout conversions)."""
    if device.startswith("cuda") and train_cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


def compile_wanted(setting: str | bool, device: str, deterministic: bool = False) -> bool:
    """``compile: auto`` means on CUDA, unless the run must be deterministic: two compiled stage-1 runs on an
    H100 differed in the last bits."""
    if setting == "auto":
        return device.startswith("cuda") and not deterministic
    return bool(setting)


class CompiledLoss:
    """``fn`` through ``torch.compile`` (``train.compile``: auto = on CUDA unless ``train.deterministic``), with
    a clean fallback: if compiling fails on the first calls (no Triton, an unsupported op), say so once and run
    ``fn`` eagerly from then on."""

    def __init__(self, fn: Callable, train_cfg, device: str):
        cuda = device.startswith("cuda")
        enabled = compile_wanted(train_cfg.compile, device, cuda and bool(train_cfg.deterministic))
        # CUDA graphs replay the compiled forward and backward without a launch per kernel
        mode = "reduce-overhead" if cuda and train_cfg.cuda_graphs else None
        self.fn, self.compiled, self.proven = fn, torch.compile(fn, mode=mode) if enabled else None, False

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.fn(*args, **kwargs)
        if self.proven:
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001  (any compiler failure: fall back, never stop training)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            log.warning("torch.compile failed (%s: %s); training runs eagerly (train.compile=false hides this)",
                        type(e).__name__, first[:200])
            self.compiled = None
            return self.fn(*args, **kwargs)
        self.proven = True
        return out


@contextlib.contextmanager
def tensors_swapped(targets: list[torch.Tensor], values: list[torch.Tensor]):
    """Each of ``targets`` holds its ``values`` inside the block and its own contents again after it, copied in
    place (compiled graphs and optimisers keep their addresses)."""
    targets = [t.detach() for t in targets]
    with torch.no_grad():
        own = [t.clone() for t in targets]
        torch._foreach_copy_(targets, list(values))
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(targets, own)


class WeightAverage:
    """``train.ema_decay``: an exponential moving average of the trained weights, updated after every optimiser
    step. The average is what a checkpoint's ``model.safetensors`` holds and what validation and evaluation run
    (``swapped_in``); the trained weights go on training and are saved beside it (``TRAINED``) for an exact
    resume. Its decay warms up as (1 + t) / (10 + t), so the early average does not hold the initialisation."""
    TRAINED = "trained_weights.safetensors"

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = float(decay)
        self.names, self.params = map(list, zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad]))
        self.average = [p.detach().clone() for p in self.params]

    @classmethod
    def from_config(cls, model: torch.nn.Module, train_cfg) -> WeightAverage | None:
        decay = train_cfg.get("ema_decay")
        return None if decay is None else cls(model, float(decay))

    def decay_at(self, step: int) -> float:
        """The decay applied after optimiser step ``step`` (0-based)."""
        return min(self.decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def update(self, step: int) -> None:
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - self.decay_at(step))

    def swapped_in(self):
        """The model holds the average inside the block."""
        return tensors_swapped(self.params, self.average)

    @torch.no_grad()
    def restore(self, trained: dict[str, torch.Tensor], where: str) -> None:
        """On resume, the model having loaded the checkpoint's weights (the average): take them as the average,
        then put the ``trained`` weights back into the model."""
        missing = [name for name in self.names if name not in trained]
        if missing:
            raise RiptError(f"{where}: no trained weight {missing[0]!r} ({len(missing)} missing); the checkpoint "
                            f"was written with another model or without train.ema_decay")
        for avg, p, name in zip(self.average, self.params, self.names):
            avg.copy_(p)
            p.copy_(trained[name])


def averaged(average: WeightAverage | None):
    """The model holding its weight average inside the block (where there is one)."""
    return contextlib.nullcontext() if average is None else average.swapped_in()


class NonFiniteLoss(RiptError):
    """A training loss or gradient became NaN/inf; no update was applied and no checkpoint is written."""


class GuardedStep:
    """One optimiser step per call that refuses non-finite losses and gradients, with the gradients averaged
    over ranks under torchrun (weighted by ``weight`` when the loss is a mean over a count that differs between
    ranks) and clipped to ``clip``; then the weights' moving ``average`` (if any) moves.

    With a fused optimiser (CUDA) the check does not stop the host every step: the step's finiteness stays on
    the device, and from the first non-finite step on the fused kernel skips every update (its ``found_inf``),
    so weights and optimiser state stay those of the last good step; ``check()`` — called before logging,
    validating and saving — raises. Elsewhere every call checks at once (one device sync)."""

    def __init__(self, model: torch.nn.Module, opt, sched, clip: float, info: DistInfo | None = None,
                 average: WeightAverage | None = None):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt, self.sched, self.clip, self.info, self.average = opt, sched, float(clip), info, average
        self.deferred = all(group.get("fused") for group in opt.param_groups)
        if self.deferred:
            device = self.params[0].device
            self.bad = torch.zeros((), device=device)  # 1.0 once any step was non-finite (the fused kernels' flag)
            self.first_step = torch.full((), -1, dtype=torch.long, device=device)
            self.first_values = torch.zeros(2, device=device)  # that step's loss and gradient norm
            opt.found_inf = self.bad

    def __call__(self, loss: torch.Tensor, step: int, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The step's gradient norm (a device tensor; before clipping)."""
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.info is not None:
            average_gradients(self.params, self.info, weight)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        values = torch.stack([loss.detach().float(), norm.float()])
        if self.deferred:
            new_bad = ~torch.isfinite(values).all() & (self.bad == 0)
            self.first_step.copy_(torch.where(new_bad, step, self.first_step))
            self.first_values.copy_(torch.where(new_bad, values, self.first_values))
            self.bad.copy_(torch.maximum(self.bad, new_bad.float()))  # in place: the optimiser holds this tensor
        else:
            loss_value, norm_value = values.tolist()
            if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                self._raise(step, loss_value, norm_value)
        self.opt.step()
        self.sched.step()
        if self.average is not None:
            self.average.update(step)
        return norm.detach()

    def check(self) -> None:
        """Raise ``NonFiniteLoss`` if a step since the start was non-finite (syncs with the device)."""
        if self.deferred:
            first = int(self.first_step)
            if first >= 0:
                self._raise(first, *self.first_values.tolist())

    @staticmethod
    def _raise(step: int, loss_value: float, norm_value: float):
        raise NonFiniteLoss(f"non-finite training loss {loss_value} (gradient norm {norm_value}) at step {step + 1}; "
                            f"no update applied, checkpoints/last is the last good checkpoint; "
                            f"lower train.lr or check the data")
