"""How the simulators render: MuJoCo picks its GL backend when it is first imported, and headless machines
need EGL, so every module that may import MuJoCo imports this one first. Also which EGL device renders."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import subprocess
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


def rank_gpu() -> int | None:
    """Under torchrun, the GPU this rank computes on (``init_rank`` made ``cuda:<local rank>`` the current
    device), as the host numbers it: the rank's env workers render there rather than all on one GPU (a GPU
    serves a fixed number of readbacks per second across all processes). None alone, on a CPU rank, or before
    the rank chose its GPU."""
    torch = sys.modules.get("torch")  # not imported for this: simulator processes never load it
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 or torch is None or not torch.cuda.is_initialized():
        return None
    return physical_gpu(torch.cuda.current_device())


EGL_CUDA_DEVICE_NV = 0x323A  # EGL_NV_device_cuda: the CUDA ordinal of an EGL device


def egl_cuda_ordinals() -> list[int | None]:
    """Each EGL device's CUDA ordinal (None: not a CUDA GPU, e.g. a software renderer), in EGL's order, which
    need not be CUDA's. NVIDIA's EGL lists every GPU but reports the ordinals CUDA gives them in this process:
    renumbered by ``CUDA_VISIBLE_DEVICES``, and none for the GPUs it hides."""
    import ctypes

    from mujoco.egl import egl_ext

    devices = egl_ext.eglQueryDevicesEXT(32)
    address = egl_ext.eglGetProcAddress("eglQueryDeviceAttribEXT")
    if not address:
        return [None] * len(devices)
    query = ctypes.CFUNCTYPE(egl_ext.EGLBoolean, egl_ext.EGLDeviceEXT, egl_ext.EGLint,
                             ctypes.POINTER(ctypes.c_ssize_t))(address)
    ordinals: list[int | None] = []
    for device in devices:
        value = ctypes.c_ssize_t(-1)
        ordinals.append(int(value.value) if query(device, EGL_CUDA_DEVICE_NV, ctypes.byref(value)) else None)
    return ordinals


@functools.cache
def host_render_gpus() -> tuple[int, ...]:
    """The GPUs of this host EGL can render on, numbered as the host numbers them (CUDA's ordinals without
    ``CUDA_VISIBLE_DEVICES``). Asked in a child process without the variable where this one has it (a Ray
    actor): EGL reports ordinals as CUDA numbers them here."""
    if os.environ.get("MUJOCO_GL") != "egl":
        return ()
    try:
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            return tuple(sorted(o for o in egl_cuda_ordinals() if o is not None))
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        out = subprocess.run([sys.executable, "-c", "from ript.envs.gl import egl_cuda_ordinals as o; print(o())"],
                             env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        return tuple(sorted(o for o in ast.literal_eval(out.strip().splitlines()[-1]) if o is not None))
    except Exception:  # noqa: BLE001  (no EGL library or no GPU: the renderer itself will say so when it is built)
        return ()


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


def worker_render_gpus(workers: int, render_gpus: list[int] | None = None) -> list[int | None]:
    """The GPU (as the host numbers them) each of ``workers`` simulator processes renders on: ``render_gpus``
    round-robin (``workers.render_gpus``), else a torchrun rank's own GPU (``rank_gpu``), else round-robin over
    the host's GPUs other than the one this process computes on (a GPU serves a fixed number of readbacks per
    second across all processes), else EGL's default (None; also wherever the user set MUJOCO_EGL_DEVICE_ID,
    which the workers inherit)."""
    check_render_environment()
    if EGL_DEVICE in os.environ:
        return [None] * workers
    if render_gpus:
        return [int(render_gpus[i % len(render_gpus)]) for i in range(workers)]
    own = rank_gpu()
    if own is not None:
        return [own] * workers
    host = host_render_gpus()
    if len(host) < 2:
        return [None] * workers
    # the GPUs this process does not compute on, where it has chosen one: a decision made while simulators render
    # on its own GPU is slower (renders_apart)
    torch = sys.modules.get("torch")
    busy = physical_gpu(torch.cuda.current_device()) if torch is not None and torch.cuda.is_initialized() else None
    spare = [g for g in host if g != busy]
    return [spare[i % len(spare)] for i in range(workers)]


def physical_gpu(index: int) -> int:
    """A CUDA device index of this process as the host numbers its GPUs (EGL lists every GPU of the host, while
    ``CUDA_VISIBLE_DEVICES``, as Ray sets it for an actor, renumbers the ones this process sees from 0)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    return int(visible[index]) if index < len(visible) and visible[index].strip().isdigit() else index


def renders_apart(policy_device, render_gpus: list[int | None] | None) -> bool:
    """Whether simulators rendering on ``render_gpus`` (None: not known) leave the GPU of a policy on
    ``policy_device`` (a torch device) alone. Where they share it, a decision made while they render took 4-6x
    longer on an H100 (its CUDA work waits on their GL work), so the runner then plans in lock-step."""
    if policy_device.type != "cuda":
        return False  # a policy on the CPU shares the host's cores with the simulators
    if os.environ.get("MUJOCO_GL") != "egl":
        return True
    if render_gpus is None:
        return False
    import torch

    index = physical_gpu(policy_device.index if policy_device.index is not None else torch.cuda.current_device())
    return all(g is not None and g != index for g in render_gpus)


def use_render_gpu(gpu: int | None) -> None:
    """In a simulator process, before its first renderer: render on the host's GPU ``gpu`` (None: leave EGL's
    choice). The process computes nothing on a GPU, so it drops ``CUDA_VISIBLE_DEVICES`` (a Ray actor's, under
    which EGL would report renumbered CUDA ordinals) and finds the EGL device of that CUDA ordinal (EGL's order
    need not be CUDA's: rendering on EGL device i could load another process's GPU)."""
    if gpu is None:
        return
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        ordinals = egl_cuda_ordinals()
    except Exception:  # noqa: BLE001  (no EGL: the renderer says so when it is built)
        return
    os.environ[EGL_DEVICE] = str(ordinals.index(gpu) if gpu in ordinals else gpu)
