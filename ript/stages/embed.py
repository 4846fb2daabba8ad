"""``ript embed``: a suite's task instructions embedded into the language cache that the training stages read,
so that a host without the language-model package trains from the file alone."""

from __future__ import annotations

from pathlib import Path

from ript.config import task_names
from ript.data.language import TASK_ID, embed_instructions
from ript.envs.suites import get_suite
from ript.errors import RiptError
from ript.utils.logging import log, setup_console_logging


def run(cfg) -> Path:
    setup_console_logging()
    encoder = str(cfg.lang.encoder)
    if encoder == TASK_ID:
        raise RiptError("lang.encoder=task_id learns a table of task ids: there are no instructions to embed")
    cache = Path(cfg.lang.cache_file)
    instructions = get_suite(str(cfg.task.suite)).instructions(task_names(cfg.task))
    embeddings = embed_instructions(list(instructions.values()), encoder, cache)
    log.info("embed: %d instructions (%d dimensions, %s) in %s", len(instructions), embeddings.shape[1], encoder,
             cache)
    return cache
