"""What a config field may hold: the checks every section's __post_init__ runs (an `Invalid` names the
key; the loader adds where the value came from), and which fields a resumed run may change. No torch;
nothing of the project but core."""

from __future__ import annotations

import dataclasses
from typing import Any

from hpc.core.errors import ConfigError


class Invalid(ConfigError):
    """Raised by __post_init__ checks; the loader adds the source and raises a ConfigError naming it.
    `other`: the key a value was checked against, named with its own source (either may be the one given)."""

    def __init__(self, key: str, reason: str, other: str | None = None):
        super().__init__(reason)
        self.key = key
        self.reason = reason
        self.other = other


def check(ok: bool, key: str, reason: str, other: str | None = None) -> None:
    if not ok:
        raise Invalid(key, reason, other)


def positive(obj: object, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        check(value is None or value > 0, key, "must be > 0")


def non_negative(obj: object, *keys: str) -> None:
    for key in keys:
        value = getattr(obj, key)
        check(value is None or value >= 0, key, "must be >= 0")


def at_most(obj: object, key: str, limit: int, why: str) -> None:
    value = getattr(obj, key)
    check(value is None or value <= limit, key, f"must be <= {limit} ({why})")


def one_of(obj: object, key: str, choices: tuple[object, ...]) -> None:
    check(getattr(obj, key) in choices, key, f"must be one of {', '.join(map(str, choices))}")


def resumable(default: Any) -> Any:
    """A field that may change when a run is resumed: it does not change the result (where data lives,
    how often to log or save, when to stop, what to profile). Every other field must match config.yaml."""
    return dataclasses.field(default=default, metadata={"resumable": True})
