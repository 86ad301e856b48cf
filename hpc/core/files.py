"""Writing and reading the toolkit's files: atomic writes, JSON and strict YAML.

- `write_atomic`: a temp file in the same directory, fsync, rename; a reader never sees half a file.
- `read_json`: a JSON file's value, or None with the reason handed to `warn`.
- `load_yaml_text` / `dump_yaml`: YAML through a SafeLoader that also refuses a key given twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

Warn = Callable[[str], None]


def ignore(message: str) -> None:
    """A `warn` that drops the message: the caller only wants the value or None."""


def write_atomic(path: str | os.PathLike, text: str | bytes) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    data = text.encode() if isinstance(text, str) else text
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (disk full, a signal) leaves no temp file behind
        raise


def read_json(path: Path, warn: Warn = ignore) -> Any:
    """The JSON value in `path`, or None (and `warn` says why) when it cannot be read or parsed."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        warn(f"{path}: unreadable ({' '.join(str(e).split())[:200]})")
        return None


_MERGE = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no tags, no code) that also refuses a key given twice in one mapping, where
    safe_load keeps the last one silently. Merge keys (`<<: *base`) work as in safe_load: a key
    written in the mapping overrides the merged one."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:  # `<<: *base`: merged keys may be overridden, as YAML says
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, (str, int, float, bool)):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str) -> Any:
    """Parse YAML safely and strictly (see _StrictLoader). Raises yaml.YAMLError."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass: as safe as safe_load


def plain(value: Any) -> Any:
    """Tuples to lists, for YAML/JSON output."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(plain(data), sort_keys=False, default_flow_style=None)
