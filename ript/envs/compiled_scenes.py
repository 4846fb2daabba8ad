"""Compiled MuJoCo scenes kept on disk, so that a scene is compiled once per run on a host, not once per build.

robosuite compiles a scene's whole MJCF text in its env constructor (``MjSim.from_xml_string``). For a LIBERO
scene that is 1.4-3.2 s of a 3-5 s build on a CPU core (its meshes and ~185 MiB of textures decoded and processed),
and RL's env slots build a scene whenever a slot meets a task of another one. MuJoCo's binary model format
(``.mjb``) holds the compiled model exactly; loading it skips the compiler. The cache is keyed by the text
itself and MuJoCo's version, so a changed scene or library never loads a stale model, and each file is written
whole (a temporary file renamed into place) so that workers building at once never read half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("ript")


class CompiledScenes:
    """A folder of compiled scenes shared by a run's env workers (``create``: a fresh one, removed by ``remove``;
    workers receive it pickled and only read and add files)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.write_failed = False  # a full or read-only disk: go on compiling, say it once

    @classmethod
    def create(cls) -> CompiledScenes:
        return cls(tempfile.mkdtemp(prefix="ript-compiled-scenes-"))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def path_for(self, xml: str) -> Path:
        import mujoco

        key = hashlib.sha1(f"{mujoco.__version__}\n{xml}".encode()).hexdigest()
        return self.directory / f"{key}.mjb"

    def model(self, xml: str):
        """The compiled model of ``xml``: loaded if a worker saved it before, else compiled, and saved by the one
        worker that claims it first (workers that start on a scene together each compile it once; one writes)."""
        import mujoco

        path = self.path_for(xml)
        damaged = False
        if path.exists():
            try:
                return mujoco.MjModel.from_binary_path(str(path))
            except (ValueError, OSError) as err:  # not one of ours whole: compile it again
                log.warning("compiled scene %s could not be read (%s); compiling the scene", path, err)
                damaged = True
        model = mujoco.MjModel.from_xml_string(xml)
        if damaged or self._claim(path):
            self._save(model, path)
        return model

    def _claim(self, path: Path) -> bool:
        """Whether this worker is the first to save ``path`` (a claim file, created once)."""
        try:
            os.close(os.open(path.with_suffix(".claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False
        except OSError as err:
            self._saving_failed(err)
            return False

    def _save(self, model, path: Path) -> None:
        import mujoco

        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".mjb.tmp")
            os.close(fd)
            mujoco.mj_saveModel(model, tmp, None)
            os.replace(tmp, path)
        except (OSError, ValueError) as err:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self._saving_failed(err)

    def _saving_failed(self, err: Exception) -> None:
        if not self.write_failed:
            log.warning("compiled scenes are not kept in %s (%s): each build compiles its scene", self.directory, err)
        self.write_failed = True

    @contextlib.contextmanager
    def serving_robosuite(self) -> Iterator[None]:
        """While inside, robosuite's envs take their compiled model from this cache (robosuite offers no hook
        for it: its ``MjSim.from_xml_string`` is replaced for the duration and restored after)."""
        from robosuite.utils.binding_utils import MjSim

        original = MjSim.__dict__["from_xml_string"]
        MjSim.from_xml_string = classmethod(lambda sim_class, xml: sim_class(self.model(xml)))
        try:
            yield
        finally:
            MjSim.from_xml_string = original
