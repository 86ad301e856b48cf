"""Writing and reading the toolkit's files: atomic writes, JSON and strict YAML.

- `write_atomic`: a temp file in the same directory, fsync, rename; a reader never sees half a file, and
  a write that fails (disk full, read-only) is a WriteError naming the file, the previous one intact. The
  temp file is made new (O_EXCL | O_NOFOLLOW, a name no one can guess: a link planted there is never
  followed) with the owner's mode (hpc/core/owner.py), whatever the umask.
- `append_line`: one line added to a log whole, or not at all.
- `temp_name` / `is_temp_name`: the one naming rule of temp files, so a later run can find and remove
  those a killed writer left.
- `read_json`: a JSON file's value, or None with the reason handed to `warn`.
- `load_yaml_text` / `dump_yaml`: YAML through a SafeLoader that also refuses a key given twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from hpc.core.errors import WriteError
from hpc.core.owner import open_append, open_new

T = TypeVar("T")

Warn = Callable[[str], None]
JsonObject = dict[str, object]  # a JSON object whose keys another owns (a config, a profiler cycle): read where used


def ignore(message: str) -> None:
    """A `warn` that drops the message: the caller only wants the value or None."""


def temp_name(path: Path, pid: int | None = None) -> Path:
    """Where `path` is written before its rename: `.<name>.tmp.<pid>` beside it."""
    return path.with_name(f".{path.name}.tmp.{os.getpid() if pid is None else pid}")


def is_temp_name(name: str) -> bool:
    """A temp file of ours (`.<name>.tmp.<pid>`) or of the profiler's (Kineto writes `<trace>.tmp`)."""
    return (name.startswith(".") and ".tmp." in name) or name.endswith(".tmp")


def write_failure(path: str | os.PathLike[str], error: OSError, kept: bool) -> WriteError:
    """The one line of a failed write: the file, the system's reason, and what is on disk now."""
    state = "the previous version is intact" if kept else "nothing was written"
    return WriteError(f"{path}: could not be written ({error.strerror or type(error).__name__}); {state}")


def write_atomic(path: str | os.PathLike[str], text: str | bytes, mode: int | None = None) -> None:
    """Write via a new temp file in the same directory and rename, so readers never see half a file. A
    failure is a WriteError naming the file and the cause; the temp file is removed, the old file kept.
    `mode`: the file's (default: the owner's, hpc/core/owner.py `file_mode`)."""
    path = Path(path)
    # surrogateescape: a name given as undecodable bytes (argv, the environment) is written back as those bytes
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    tmp = path.with_name(f"{temp_name(path).name}.{secrets.token_hex(4)}")
    made = False
    try:
        with os.fdopen(open_new(tmp, mode), "wb") as f:
            made = True
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if made:  # a failed write (disk full, a signal) leaves no temp file behind
            with contextlib.suppress(OSError):
                tmp.unlink()
        if isinstance(e, OSError) and not isinstance(e, WriteError):
            raise write_failure(path, e, path.exists()) from None
        raise


def append_line(path: Path, line: str) -> None:
    """Add one line to a log such as metrics.jsonl, whole or not at all: a line a kill cut short before
    is ended first (its reader skips it), and a failed write is cut back off and is a WriteError."""
    data = line.encode("utf-8", "surrogateescape") + b"\n"
    size = None
    try:
        with os.fdopen(open_append(path), "a+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
                data = b"\n" + data
            f.write(data)
            f.flush()
    except OSError as e:
        if size is not None:
            with contextlib.suppress(OSError):
                os.truncate(path, size)
        raise write_failure(path, e, path.exists()) from None


MAX_JSON_BYTES = 2**30  # summary.json and index.json are kilobytes to megabytes


def read_json(path: Path, warn: Warn = ignore) -> object:
    """The JSON value in `path`, or None (and `warn` says why) when it cannot be read or parsed, or is no
    regular file of at most MAX_JSON_BYTES (a device such as /dev/zero would be read for ever)."""
    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_JSON_BYTES:
            warn(f"{path}: ignored: not a regular file of at most {MAX_JSON_BYTES // 2**20} MiB")
            return None
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as e:
        warn(f"{path}: unreadable ({' '.join(str(e).split())[:200]})")
        return None


_AT = re.compile(r" - at `\$((?:\.\w+|\[\d+\])*)`$")


def with_value(data: object, said: str) -> str:
    """A decoder's complaint about `data` (msgspec's "Expected `int`, got `str` - at `$.ranks[0].rank`")
    as one line that names the place and its bad value ("ranks[0].rank 'x': Expected `int`, got `str`")."""
    at = _AT.search(said)
    if at is None or not at.group(1):
        return said[:200]
    value = data
    for key, index in re.findall(r"\.(\w+)|\[(\d+)\]", at.group(1)):
        if key and isinstance(value, dict):
            value = value.get(key)
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return said[:200]
    return f"{at.group(1).lstrip('.')} {str(value)[:40]!r}: {said[: at.start()][:160]}"


def other_layout(data: object, reads: int) -> str | None:
    """Why a JSON record of another layout (its `schema`: a later toolkit's file) is not read, in words;
    None for one of layout `reads`, or one without the field (written before it was added: the first)."""
    schema = data.get("schema", reads) if isinstance(data, dict) else reads
    if type(schema) is int and schema == reads:
        return None
    return layout_said(schema, reads)


def layout_said(schema: object, reads: int) -> str:
    """The words for a record of layout `schema` that a reader of layout `reads` refuses (every reader's)."""
    return f"schema {schema!r:.40}, and this toolkit reads schema {reads}"


def decoded(data: object, kind: type[T], reads: int, where: str, warn: Warn) -> T | None:
    """A JSON value (read_json's) as the struct `kind` of layout `reads`; None when it is of another layout or
    not that shape, said through `warn` in one line naming `where`, the place and its bad value."""
    why = other_layout(data, reads)
    if why is None:
        try:
            return msgspec.convert(data, kind)
        except msgspec.ValidationError as e:
            why = with_value(data, str(e))
    warn(f"{where}: ignored: {why}")
    return None


_MERGE = "tag:yaml.org,2002:merge"
MAX_YAML_DEPTH = 100  # a config is a few levels deep; a deeper document is refused before Python's recursion limit


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no tags, no code) that also refuses a key given twice in one mapping, where
    safe_load keeps the last one silently. Merge keys (`<<: *base`) work as in safe_load: a key
    written in the mapping overrides the merged one. Nesting deeper than MAX_YAML_DEPTH is refused at
    once (PyYAML composes recursively: thousands of levels took seconds to end in a RecursionError)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner looks ahead over every open `[`/`{` (quadratically: 3000 took a second): stop it too.
        if self.flow_level >= MAX_YAML_DEPTH:
            raise yaml.scanner.ScannerError(
                None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", self.get_mark()
            )
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # PyYAML stubs: untyped
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

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


def load_yaml_text(text: str) -> object:
    """Parse YAML safely and strictly (see _StrictLoader). Raises yaml.YAMLError."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass: as safe as safe_load


def plain(value: Any) -> Any:
    """Tuples to lists, for YAML/JSON output."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def dump_yaml(data: object) -> str:
    return yaml.safe_dump(plain(data), sort_keys=False, default_flow_style=None)
