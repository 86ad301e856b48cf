"""A trace's events as typed structs, a window at a time (reader.py cuts the windows); no torch import.

A window's events decode in one msgspec call by their phase: a complete event (`ph: X`) into `Event`,
an instant into `Instant`, each holding only the fields the analysis reads (`Args`, `MemoryArgs` the
same for `args`); every other phase of the Chrome format into an empty struct. Everything else in an
event is skipped by the decoder, never built.

Events are typed on the fast path: a window whose events all have the expected types (numbers for
times, strings for names ...) decodes in one call. A window with a mistyped event, or a phase outside
the format, is decoded again leniently and each event checked by `admit`: the events the analysis would
read but cannot (a string `ts`, a list for a name) are counted as bad and skipped, so one bad event costs
neither the trace nor its window.

Also here: the few helpers that read a column from a window's structs (`pick`, `field`, `interned`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, NamedTuple, Protocol, TypeGuard, TypeVar, Union

import msgspec
import numpy as np

NUMBER_LIMIT = 1e300  # beyond it (or NaN) a number is garbage; JSON's 1e999 decodes to inf
_NUMBER = (int, float)  # exact types: bool is not a number here
_ID = (int, str, type(None))  # pid, tid, device ids: hashable scalars
ID_LIMIT = 1 << 62  # a stream or correlation id beyond it is garbage


def int_args(values: list) -> np.ndarray:
    """Integer args (stream, correlation) as int64; -1 where absent or not a sane integer."""
    if set(map(type, values)) == {int}:  # the usual case, checked in C
        try:
            out = np.array(values, dtype=np.int64)
        except OverflowError:
            pass
        else:
            out[(out <= -ID_LIMIT) | (out >= ID_LIMIT)] = -1
            return out
    return np.array([v if type(v) is int and -ID_LIMIT < v < ID_LIMIT else -1 for v in values], dtype=np.int64)


class Args(msgspec.Struct, gc=False):
    """The args of a complete event the analysis reads, by their names in the trace; checked where they
    are used. Few fields on purpose: every complete event builds one."""

    correlation: object = None
    stream: object = None
    collective: object = msgspec.field(name="Collective name", default=None)
    in_nelems: object = msgspec.field(name="In msg nelems", default=None)
    out_nelems: object = msgspec.field(name="Out msg nelems", default=None)
    dtype: object = None
    group_size: object = msgspec.field(name="Group size", default=None)
    # a kernel replayed from a CUDA graph (CUPTI's graphId; 0: launched alone)
    graph_id: object = msgspec.field(name="graph id", default=None)


class MemoryArgs(msgspec.Struct, gc=False):
    """The args of a `[memory]` event, typed: a memory event with a mistyped one is bad."""

    device_type: int | str | None = msgspec.field(name="Device Type", default=None)
    device_id: int | str | None = msgspec.field(name="Device Id", default=None)
    total_allocated: float | None = msgspec.field(name="Total Allocated", default=None)
    total_reserved: float | None = msgspec.field(name="Total Reserved", default=None)
    nbytes: float | None = msgspec.field(name="Bytes", default=None)


NO_ARGS, NO_MEMORY_ARGS = Args(), MemoryArgs()  # what an event without args reads as: every arg absent


def pick(items: list, idx: np.ndarray) -> list:
    """The items at the given indices, looked up in C: a window's events are thousands."""
    if idx.size < 2:  # itemgetter of one index returns the item, not a tuple of it
        return [items[i] for i in idx.tolist()]
    return list(itemgetter(*idx.tolist())(items))


def field(items: list, name: str) -> list:
    """Each item's attribute `name`, read in C."""
    return list(map(attrgetter(name), items))


T = TypeVar("T")
H = TypeVar("H", bound=Hashable)


def interned(
    found: list[int | None], items: Sequence[T], key: Callable[[T], H], ids: Mapping[H, int], new: Callable[[H], int]
) -> np.ndarray:
    """Ids as int32: `found` holds each item's `ids.get(key(item))`, looked up by the caller in one pass
    (None: not there yet); such an item's key gets `new(key)`, once."""
    if None in found:
        found = [i if i is not None else ids.get(key(x)) or new(key(x)) for i, x in zip(found, items, strict=True)]
    return np.fromiter(found, np.int32, len(found))


def all_args(events: list, absent: object = NO_ARGS) -> list:
    """Each event's args, `absent` where it has none."""
    args = field(events, "args")
    return [a or absent for a in args] if None in args else args


# Every event answers `cat`, so that a window is routed by one C-level map over its events (trace._route):
# an instant's is INSTANT (its own category is never read: `[memory]` events are known by name), an
# unread phase's NOT_READ; neither can be a decoded category.
INSTANT, NOT_READ = object(), object()


class Event(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event (`ph: X`: operators, runtime calls, kernels, memcpys ...): the fields the analysis
    reads, typed (gc=False: a struct of scalars holds no cycle)."""

    cat: str | None = None
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float = math.nan  # NaN: no time (the event is not read); a null time sends the window to `admit`
    dur: float = 0.0
    args: Args | None = None


class Instant(msgspec.Struct, tag_field="ph", tag="i", gc=False):
    """An instant event (`ph: i`): the `[memory]` events are these."""

    cat: ClassVar[object] = INSTANT
    name: str = ""
    ts: float | None = None
    args: MemoryArgs | None = None


# Every other phase of the Chrome trace format decodes to an empty struct: its fields are parsed but
# never built, which matters because a third of a Kineto trace is flow events (`s`, `f`). An event with
# a phase outside these, or none, sends its window to the lenient path: read the same, more slowly.
OTHER_PHASES = "BEICbneSTpFstfPONDMVvRc()"
_SKIPPED = tuple(
    msgspec.defstruct(f"Phase{i}", [], tag_field="ph", tag=phase, gc=False, namespace={"cat": NOT_READ})
    for i, phase in enumerate(OTHER_PHASES)
)


class _LooseEvent(msgspec.Struct, gc=False):
    """The same fields, any type: how a window with a mistyped event is read before `admit` checks it."""

    ph: object = None
    cat: object = None
    name: object = ""
    pid: object = None
    tid: object = None
    ts: object = None
    dur: object = None
    args: object = None


_ANY_PHASE: Any = Union.__getitem__((Event, Instant, *_SKIPPED))  # one tagged union, built from a tuple
_STRICT = msgspec.json.Decoder(list[_ANY_PHASE])
_LOOSE = msgspec.json.Decoder(list[_LooseEvent])
_LOOSE_FIELDS = _LooseEvent.__struct_fields__


class Routed(Protocol):
    """What every decoded event answers: `cat`, by which trace._route gives it to an accumulator."""

    @property
    def cat(self) -> object: ...


class Batch(NamedTuple):
    events: list[Routed]  # Event, Instant, or the empty struct of a phase not read
    n_events: int  # how many events the file had there
    bad: int  # how many of them the analysis would read but cannot (mistyped fields)


def _number(value: object) -> TypeGuard[float]:
    """A finite int or float within NUMBER_LIMIT (never a bool)."""
    # exact types, as before: every event's fields pass here; mypy cannot narrow by `type(v) in`
    return type(value) in _NUMBER and -NUMBER_LIMIT < value < NUMBER_LIMIT  # type: ignore[operator]


def _id(value: object) -> TypeGuard[int | str | None]:
    return type(value) in _ID


def out_of_range(values: np.ndarray) -> np.ndarray:
    """Which of a column's numbers are garbage (beyond NUMBER_LIMIT); NaN there means absent, not garbage.
    The column-wise twin of `_number`, for typed windows whose numbers msgspec has already checked."""
    return ~np.isnan(values) & ~(np.abs(values) < NUMBER_LIMIT)


class _Mistyped(Exception):
    """A field the analysis reads has the wrong type: the event is bad."""


def _args(value: object) -> Args | None:
    """A decoded args mapping as Args (their fields are checked where used); None when it is not a mapping."""
    return msgspec.convert(value, Args) if isinstance(value, dict) else None


def _memory_args(value: object) -> MemoryArgs | None:
    """A decoded args mapping as MemoryArgs; None when it is not a mapping. A mistyped field raises _Mistyped."""
    if not isinstance(value, dict):
        return None
    try:
        args = msgspec.convert(value, MemoryArgs)
    except msgspec.ValidationError:
        raise _Mistyped from None
    if not all(v is None or _number(v) for v in (args.total_allocated, args.total_reserved, args.nbytes)):
        raise _Mistyped  # NaN or out of range: a decoded Python float can be either
    return args


def admit(e: _LooseEvent) -> Event | Instant | None | bool:
    """A leniently decoded event as an Event; None when the analysis does not read it; False when it
    would be read but a field it needs has the wrong type (a string ts, a list for a name ...)."""
    ph = e.ph
    name = e.name
    ts = e.ts
    if ph == "X":
        if ts is None:
            return None
        dur = e.dur or 0.0
        pid, tid = e.pid, e.tid
        if not (_number(ts) and _number(dur) and type(name) is str and _id(pid) and _id(tid)):
            return False
        return Event(e.cat if type(e.cat) is str else None, name, pid, tid, float(ts), float(dur), _args(e.args))
    if ph == "i" and name == "[memory]":
        try:
            args = _memory_args(e.args)
        except _Mistyped:
            return False
        if (e.args is not None and not args) or not (ts is None or _number(ts)):
            return False
        return Instant(name, None if ts is None else float(ts), args)
    return None


def admitted(loose: Sequence[object]) -> Batch:
    """Events decoded leniently (structs, or values from the standard library's decoder) as a Batch."""
    events: list[Routed] = []
    bad = 0
    for value in loose:
        if isinstance(value, dict):
            value = _LooseEvent(**{k: value[k] for k in _LOOSE_FIELDS if k in value})
        if isinstance(value, _LooseEvent):
            event = admit(value)
            if isinstance(event, (Event, Instant)):
                events.append(event)
            bad += event is False
    return Batch(events, len(loose), bad)


def typed(text: str) -> Batch:
    """A window (the text of a JSON array of events) decoded typed. Raises msgspec.ValidationError for a
    mistyped event or an unknown phase, msgspec.DecodeError for text that is no JSON array."""
    events = _STRICT.decode(text)
    return Batch(events, len(events), 0)


def lenient(text: str) -> Batch:
    """A window decoded leniently, each event admitted or counted as bad. Raises msgspec.DecodeError."""
    return admitted(_LOOSE.decode(text))
