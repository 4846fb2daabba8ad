"""How the simulators render: MuJoCo picks its GL backend when it is first imported, and headless machines
need EGL, so every module that may import MuJoCo imports this one first. Also which EGL device renders."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ript.errors import RiptError

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


def _name_the_glfw_library() -> None:
    """gymnasium's MuJoCo renderer imports ``glfw`` even when EGL renders, and pyGLFW, unless told its library,
    starts a Python child per candidate ``libglfw`` to read its version. Those children outlive an env worker
    killed while importing (their ``EOF when reading a line`` tracebacks landed on the run's stderr) and cost
    ~40 ms per worker start; naming the wheel's own library loads it directly."""
    spec = importlib.util.find_spec("glfw")
    if "PYGLFW_LIBRARY" in os.environ or spec is None or not spec.submodule_search_locations:
        return
    library = Path(spec.submodule_search_locations[0]) / "x11" / "libglfw.so"
    if library.is_file():
        os.environ["PYGLFW_LIBRARY"] = str(library)


_name_the_glfw_library()

EGL_DEVICE = "MUJOCO_EGL_DEVICE_ID"  # MuJoCo's choice of EGL device (an index into EGL's device list)


def egl_device_count() -> int:
    """EGL devices this process could render on (0 where EGL is not the renderer or not installed)."""
    if os.environ.get("MUJOCO_GL") != "egl":
        return 0
    try:
        from mujoco.egl import egl_ext

        return len(egl_ext.eglQueryDevicesEXT())
    except Exception:  # noqa: BLE001  (no EGL library: the renderer itself will say so when it is built)
        return 0


def rank_egl_device() -> str | None:
    """Under torchrun, the GPU this rank computes on (``init_rank`` made ``cuda:<local rank>`` the current
    device), where EGL lists a device of that index: the rank's env workers render there rather than all on the
    first GPU (an EGL device serves a fixed number of readbacks per second across all processes). None alone,
    on a CPU rank, or before the rank chose its GPU."""
    torch = sys.modules.get("torch")  # not imported for this: simulator processes never load it
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 or torch is None or not torch.cuda.is_initialized():
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.current_device() != local_rank or local_rank >= egl_device_count():
        return None
    return str(local_rank)


GL_BACKENDS = ("egl", "osmesa", "glfw")  # the renderers MuJoCo accepts in MUJOCO_GL


def check_render_environment() -> None:
    """The rendering variables a user may set, checked in the job's own process before any simulator starts:
    MuJoCo would fail on them inside every worker, with a traceback."""
    backend = os.environ.get("MUJOCO_GL")
    if backend not in GL_BACKENDS:
        raise RiptError(f"MUJOCO_GL={backend!r} is not a renderer MuJoCo knows; set it to one of "
                        f"{', '.join(GL_BACKENDS)} (egl on a headless machine), or unset it")
    device = os.environ.get(EGL_DEVICE)
    if device is None or backend != "egl":
        return
    count = egl_device_count()
    if not device.isdigit() or (count and int(device) >= count):
        raise RiptError(f"{EGL_DEVICE}={device!r}: EGL lists {count} device(s) here, numbered from 0; set an index "
                        f"below {count}, or unset it")


def worker_egl_devices(workers: int) -> list[str | None]:
    """The EGL device each of ``workers`` simulator processes renders on: the user's ``MUJOCO_EGL_DEVICE_ID``,
    else a torchrun rank's own GPU (``rank_egl_device``), else round-robin over the host's devices other than
    the one this process computes on (a device serves a fixed number of readbacks per second across all
    processes), else EGL's default (None)."""
    check_render_environment()
    if EGL_DEVICE in os.environ:
        return [os.environ[EGL_DEVICE]] * workers
    rank_device = rank_egl_device()
    if rank_device is not None:
        return [rank_device] * workers
    count = egl_device_count()
    if count < 2:
        return [None] * workers
    # the GPUs this process does not compute on, where it has chosen one: a decision made while simulators render
    # on its own GPU is slower (renders_apart)
    torch = sys.modules.get("torch")
    busy = physical_gpu(torch.cuda.current_device()) if torch is not None and torch.cuda.is_initialized() else None
    spare = [i for i in range(count) if i != busy]
    return [str(spare[i % len(spare)]) for i in range(workers)]


def physical_gpu(index: int) -> int:
    """A CUDA device index of this process as the host numbers its GPUs (EGL lists every GPU of the host, while
    ``CUDA_VISIBLE_DEVICES``, as Ray sets it for an actor, renumbers the ones this process sees from 0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return int(visible[index]) if index < len(visible) and visible[index].strip().isdigit() else index


def renders_apart(policy_device, egl_devices: list[str | None] | None) -> bool:
    """Whether simulators rendering on ``egl_devices`` (None: not known) leave the GPU of a policy on
    ``policy_device`` (a torch device) alone. Where they share it, a decision made while they render took 4-6x
    longer on an H100 (its CUDA work waits on their GL work), so the runner then plans in lock-step."""
    if policy_device.type != "cuda":
        return False  # a policy on the CPU shares the host's cores with the simulators
    if os.environ.get("MUJOCO_GL") != "egl":
        return True
    if egl_devices is None:
        return False
    import torch

    index = physical_gpu(policy_device.index if policy_device.index is not None else torch.cuda.current_device())
    return all(d is not None and d != str(index) for d in egl_devices)


def use_egl_device(device: str | None) -> None:
    """In a simulator process, before its first renderer: render on ``device`` (None: leave EGL's choice)."""
    if device is not None:
        os.environ[EGL_DEVICE] = device
