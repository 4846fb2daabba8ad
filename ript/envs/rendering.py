"""Several cameras of one MuJoCo scene rendered side by side into one offscreen buffer and read back at once.

On a GPU host one EGL device delivers about 4,100 frames/s in all, however many processes render (two H200s,
``benchmarks/render_floor.py``): every readback waits for the device, and the processes'
contexts take turns on it. One readback for all of an env's cameras halves those waits for two cameras. The
first camera's pixels are those ``mujoco.Renderer`` gives; the others are drawn at another offset in the buffer,
where a few pixels on triangle edges come out otherwise (0.005% of the gripper camera's pixels over the quickstart's
demonstrations; tested to stay under 0.1%).
"""

from __future__ import annotations

import mujoco
import numpy as np

from ript.envs import gl  # noqa: F401  (before MuJoCo is imported: its GL backend)
from ript.errors import RiptError


class SharedGLContext:
    """One GL context for every renderer of a process that builds many scenes (an env worker's tasks): a context
    of its own made each scene's build several times slower (its shaders compiled again; on the CPU 0.4 s of a
    0.64 s MetaWorld build, against 0.14 s in a context that already exists). Made at the first renderer; the
    renderers draw into offscreen buffers of their own, so its surface size does not matter."""

    def __init__(self):
        self.context: mujoco.GLContext | None = None

    def acquire(self, width: int, height: int) -> mujoco.GLContext:
        if self.context is None:
            self.context = mujoco.GLContext(width, height)
        return self.context

    def close(self) -> None:
        """After every renderer that shares it has closed."""
        if self.context is not None:
            self.context.free()
            self.context = None


class SideBySideRenderer:
    """Renders ``cameras`` (names) of ``model`` at ``size`` x ``size`` each; ``render(data)`` returns one
    (size, size, 3) uint8 image per camera, in order. ``low_quality``: no shadows, reflections or skybox (and
    the model's multisampling should be off, ``model.vis.quality.offsamples = 0``). ``shared``: the GL context
    to draw in, which its owner frees (None: one of its own)."""

    def __init__(self, model: mujoco.MjModel, size: int, cameras: tuple[str, ...], low_quality: bool,
                 shared: SharedGLContext | None = None):
        ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c) for c in cameras]
        if -1 in ids:
            raise RiptError(f"render.cameras: unknown camera {cameras[ids.index(-1)]!r}")
        width = size * len(cameras)
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)  # the offscreen buffer's size
        model.vis.global_.offheight = max(model.vis.global_.offheight, size)
        self.model, self.size = model, size
        self.owns_gl = shared is None
        self.gl = mujoco.GLContext(width, size) if shared is None else shared.acquire(width, size)
        self.gl.make_current()
        self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.scene = mujoco.MjvScene(model, maxgeom=10000)
        if low_quality:
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                         mujoco.mjtRndFlag.mjRND_SKYBOX):
                self.scene.flags[flag] = 0
        self.option = mujoco.MjvOption()
        self.cameras = []
        for cam_id in ids:
            cam = mujoco.MjvCamera()
            cam.type, cam.fixedcamid = mujoco.mjtCamera.mjCAMERA_FIXED, cam_id
            self.cameras.append(cam)
        self.viewports = [mujoco.MjrRect(i * size, 0, size, size) for i in range(len(ids))]
        self.whole = mujoco.MjrRect(0, 0, width, size)
        self.pixels = np.empty((size, width, 3), dtype=np.uint8)

    def render(self, data: mujoco.MjData) -> list[np.ndarray]:
        self.gl.make_current()
        if not self.owns_gl:  # the bound framebuffer is the context's: another renderer's may be bound
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        for cam, viewport in zip(self.cameras, self.viewports):
            mujoco.mjv_updateScene(self.model, data, self.option, None, cam, mujoco.mjtCatBit.mjCAT_ALL, self.scene)
            mujoco.mjr_render(viewport, self.scene, self.context)
        mujoco.mjr_readPixels(self.pixels, None, self.whole, self.context)
        rows = self.pixels[::-1]  # OpenGL's first row is the bottom one
        return [np.ascontiguousarray(rows[:, i * self.size:(i + 1) * self.size]) for i in range(len(self.cameras))]

    def close(self) -> None:
        if self.context is not None:
            self.gl.make_current()  # another renderer's draw may have left it not current
            self.context.free()
            if self.owns_gl:
                self.gl.free()
            self.context = None
