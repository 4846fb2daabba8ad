"""Typed schemas for every job's composed config: types and ranges, checked right after composition.

Hydra's struct mode already refuses unknown keys; these schemas refuse values out of range (a zero step count,
a probability of 1.5, an unknown enum) with one line naming the key, the value and what is allowed, before a
stage creates a folder or writes a file. Sections a schema does not list (model sizes a model checks itself,
logger settings) pass through unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ript.config_schema.jobs import SCHEMAS
from ript.errors import RiptError

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
