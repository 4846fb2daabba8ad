"""Demonstrations in LeRobotDataset v3.0 layout, out and back: ``ript export`` / ``ript import``.

    meta/info.json                                    codebase_version v3.0, fps, features, paths; ``ript``: what
                                                      the HDF5 files held that LeRobot has no field for
    meta/stats.json                                   per feature: min, max, mean, std, count
    meta/tasks.parquet                                task string (index) -> task_index
    meta/episodes/chunk-000/file-000.parquet          per episode: length, tasks, where its rows and frames are
    data/chunk-000/file-000.parquet                   one row per step: action, observation.*, indices, timestamp
    videos/observation.images.<camera>/chunk-000/file-000.mp4   every episode's frames, one after another

One data file and one video per camera (LeRobot splits at 100 / 200 MB; its reader takes either). Actions,
states and low-dim observations are stored as they are (lossless); images go through the video codec
(LeRobot's default, AV1 at crf 30, unless asked otherwise), so they come back within the codec's tolerance.
Written with pyarrow, pandas and PyAV (``pip install -e .[lerobot]``): the ``lerobot`` package itself pins an
older torch than this project's.
"""

from ript.data.lerobot.export import export_lerobot
from ript.data.lerobot.load import decoded_folder, import_lerobot

__all__ = ["decoded_folder", "export_lerobot", "import_lerobot"]
