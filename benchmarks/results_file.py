"""Where a benchmark's results go: the JSON file its ``--out`` names (written whole or not at all), or standard
output without one."""

from __future__ import annotations

import json
from pathlib import Path

from ript.utils.atomic import atomic_write_text


def write_or_print(results: dict, out: str | None) -> None:
    text = json.dumps(results, indent=1)
    if out:
        atomic_write_text(Path(out), text)
    else:
        print(text)
