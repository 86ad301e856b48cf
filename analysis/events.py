"""Reading a Chrome/Kineto trace: its events, a window at a time, as typed structs; no torch import.

`read_batches(path, reader)` yields `Batch`es: the events of about a megabyte of the file, decoded
by msgspec straight into `Event` structs that hold only the fields the analysis reads (`Args` the
same for `args`); everything else in an event is skipped by the decoder, never built. The file's
own problems (truncated, not a trace, corrupt gzip) become one TraceError.

Events are typed on the fast path: a window whose events all have the expected types (numbers for
times, strings for names ...) decodes in one call. A window with a mistyped event is decoded again
leniently and each event checked by `admit`: the events the analysis would read but cannot (a string
`ts`, a list for a name) are counted as bad and skipped, so one bad event costs neither the trace nor
its window.
"""

from __future__ import annotations

import codecs
import gzip
import json
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import msgspec
import numpy as np

from hpc.core.errors import TraceError

_gzip: types.ModuleType
try:  # Intel's ISA-L (python-isal) inflates gzip about 3x faster than zlib; zlib where it is not installed
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _IsalError

    _GZIP_ERRORS: tuple[Any, ...] = (EOFError, zlib.error, gzip.BadGzipFile, _IsalError)
except ImportError:
    _gzip, _GZIP_ERRORS = gzip, (EOFError, zlib.error, gzip.BadGzipFile)

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


def _arg(name: str) -> Any:
    return msgspec.field(name=name, default=None)


class Args(msgspec.Struct, gc=False):
    """The args the analysis reads, by their names in the trace. The `[memory]` fields are typed (a
    memory event with a mistyped one is bad); the others are checked where they are used."""

    correlation: Any = None
    stream: Any = None
    collective: Any = _arg("Collective name")
    in_nelems: Any = _arg("In msg nelems")
    out_nelems: Any = _arg("Out msg nelems")
    dtype: Any = None
    group_size: Any = _arg("Group size")
    device_type: int | str | None = _arg("Device Type")
    device_id: int | str | None = _arg("Device Id")
    total_allocated: float | None = _arg("Total Allocated")
    total_reserved: float | None = _arg("Total Reserved")
    nbytes: float | None = _arg("Bytes")
    graph_id: Any = _arg("graph id")  # a kernel replayed from a CUDA graph (CUPTI's graphId; 0: launched alone)


NO_ARGS = Args()  # what an event without args reads as: every arg absent
_MEMORY_ARGS = ("Device Type", "Device Id", "Total Allocated", "Total Reserved", "Bytes")


class Event(msgspec.Struct, gc=False):
    """The fields of a trace event the analysis reads, typed (gc=False: a struct of scalars holds no cycle)."""

    ph: str = ""
    cat: str | None = None
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: Args | None = None


class _LooseEvent(msgspec.Struct, gc=False):
    """The same fields, any type: how a window with a mistyped event is read before `admit` checks it."""

    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: Any = None


_STRICT = msgspec.json.Decoder(list[Event])
_LOOSE = msgspec.json.Decoder(list[_LooseEvent])
_LOOSE_FIELDS = _LooseEvent.__struct_fields__


class Batch(NamedTuple):
    events: list[Event]  # the events the analysis may read
    n_events: int  # how many events the file had there
    bad: int  # how many of them the analysis would read but cannot (mistyped fields)


def _number(value: Any) -> bool:
    return type(value) in _NUMBER and -NUMBER_LIMIT < value < NUMBER_LIMIT


def out_of_range(values: np.ndarray) -> np.ndarray:
    """Which of a column's numbers are garbage (beyond NUMBER_LIMIT); NaN there means absent, not garbage.
    The column-wise twin of `_number`, for typed windows whose numbers msgspec has already checked."""
    return ~np.isnan(values) & ~(np.abs(values) < NUMBER_LIMIT)


class _Mistyped(Exception):
    """A field the analysis reads has the wrong type: the event is bad."""


def _args(value: Any, memory: bool) -> Args | None:
    """A decoded args mapping as Args; None when it is not a mapping. With `memory`, a mistyped `[memory]`
    field raises _Mistyped (an X event's memory fields are never read: they are dropped instead)."""
    if not isinstance(value, dict):
        return None
    try:
        args = msgspec.convert(value, Args)
    except msgspec.ValidationError:
        if memory:
            raise _Mistyped from None
        args = msgspec.convert({k: v for k, v in value.items() if k not in _MEMORY_ARGS}, Args)
    if memory and not all(v is None or _number(v) for v in (args.total_allocated, args.total_reserved, args.nbytes)):
        raise _Mistyped  # NaN or out of range: a decoded Python float can be either
    return args


def admit(e: _LooseEvent) -> Event | None | bool:
    """A leniently decoded event as an Event; None when the analysis does not read it; False when it
    would be read but a field it needs has the wrong type (a string ts, a list for a name ...)."""
    ph, name, ts = e.ph, e.name, e.ts
    if ph == "X":
        if ts is None:
            return None
        dur = e.dur or 0.0
        if not (_number(ts) and _number(dur) and type(name) is str and type(e.pid) in _ID and type(e.tid) in _ID):
            return False
        return Event(
            "X",
            e.cat if type(e.cat) is str else None,
            name,
            e.pid,
            e.tid,
            float(ts),
            float(dur),
            _args(e.args, memory=False),
        )
    if ph == "i" and name == "[memory]":
        try:
            args = _args(e.args, memory=True)
        except _Mistyped:
            return False
        if (e.args is not None and not args) or not (ts is None or _number(ts)):
            return False
        return Event("i", None, name, ts=None if ts is None else float(ts), args=args)
    return None


def admitted(loose: list[Any]) -> Batch:
    """Events decoded leniently (structs, or values from the standard library's decoder) as a Batch."""
    events: list[Event] = []
    bad = 0
    for value in loose:
        if isinstance(value, dict):
            value = _LooseEvent(**{k: value[k] for k in _LOOSE_FIELDS if k in value})
        if isinstance(value, _LooseEvent):
            event = admit(value)
            if isinstance(event, Event):
                events.append(event)
            bad += event is False
    return Batch(events, len(loose), bad)


class _Truncated(Exception):
    pass


class Reader:
    """Stream a Chrome trace's top-level object: every top-level value but `traceEvents` is decoded
    whole (they are small: metadata, kept in `meta`), the events a window at a time.

    Written here rather than taken from a streaming-JSON library because measured on the real traces
    it is faster: a window of events is one msgspec call (`_batch`); ijson's yajl backend spent most of
    the analysis time tokenising. Memory is the window (1 MiB chunks) and its events.
    """

    _WS = " \t\n\r"

    def __init__(self, stream: IO[bytes] | None = None, chunk: int = 1 << 20):
        self.stream = stream
        self.chunk = chunk
        self.text_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decoder = json.JSONDecoder()
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.meta: dict = {}
        self.saw_events = False
        self.slow_until = 0  # a window no decoder took whole: its events are read one at a time up to here

    def _fill(self) -> bool:
        if self.eof:
            return False
        assert self.stream is not None, "Reader.stream is set before reading"
        data = self.stream.read(self.chunk)
        if self.pos > (1 << 16):  # drop what has been consumed
            self.buf = self.buf[self.pos :]
            self.slow_until = max(0, self.slow_until - self.pos)
            self.pos = 0
        if not data:
            self.eof = True
            self.buf += self.text_decoder.decode(b"", final=True)
            return False
        self.buf += self.text_decoder.decode(data)
        return True

    def _peek(self) -> str:
        """The next non-blank character (not consumed)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in self._WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                raise _Truncated("unexpected end of file")

    def _expect(self, char: str) -> None:
        got = self._peek()
        if got != char:
            raise ValueError(f"expected {char!r}, found {got!r}")
        self.pos += 1

    def _value(self):
        self._peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self._fill():
                    continue
                # The whole file is read: an error at its end (or an unclosed string) means it was cut off.
                at_end = err.pos >= len(self.buf) - 1 or err.msg.startswith("Unterminated")
                raise (_Truncated if at_end else ValueError)(err.msg) from None
            # A number (or literal) that ends the window may continue in the next chunk.
            if end == len(self.buf) and not self.eof and self._fill():
                continue
            self.pos = end
            return value

    def batches(self):
        """The events, a Batch at a time; the other top-level values go to `meta`."""
        if self._peek() != "{":
            raise ValueError("top level is not an object")
        self.pos += 1
        first = True
        while True:
            if self._peek() == "}":
                self.pos += 1
                return
            if not first:
                self._expect(",")
            first = False
            key = self._value()
            if not isinstance(key, str):
                raise ValueError("object key is not a string")
            self._expect(":")
            if key != "traceEvents":
                self.meta[key] = self._value()
                continue
            self.saw_events = True
            self._expect("[")
            if self._peek() == "]":
                self.pos += 1
                continue
            while True:
                yield self._batch() or admitted([self._value()])
                sep = self._peek()
                self.pos += 1
                if sep == "]":
                    break
                if sep != ",":
                    raise ValueError(f"expected ',' or ']' between events, found {sep!r}")

    def _batch(self, tries: int = 3) -> Batch | None:
        """The window's complete events at once: the text from here to a `},` near the window's end,
        decoded as one JSON array. Sound for any cut: a JSON parser reads that prefix exactly as it
        reads the file, so the prefix decodes as a list only when the cut falls between two top-level
        events; when it falls inside one (a nested object, a string), decoding fails and an earlier cut
        is tried, then one event at a time. Typed first; a type error means a mistyped event (or a
        cut): the window is decoded again leniently and its events admitted one by one. A window no cut
        decodes (a literal msgspec refuses, such as NaN) is read one event at a time to its end, once:
        retrying the whole window after each event made such a file quadratic (a minute and more)."""
        if self.pos < self.slow_until:
            return None
        while len(self.buf) - self.pos < self.chunk and self._fill():
            pass  # a full window ahead, so that the event cut at its end is rarely decoded alone
        end = len(self.buf)
        first_cut = None
        for _ in range(tries):
            end = self.buf.rfind("},", self.pos, end)
            if end < self.pos + 4096:  # too little left to be worth it: one at a time
                return None
            first_cut = end if first_cut is None else first_cut
            text = "[" + self.buf[self.pos : end + 1] + "]"
            try:
                events = _STRICT.decode(text)
                batch = Batch(events, len(events), 0)
            except msgspec.ValidationError:
                try:
                    batch = admitted(_LOOSE.decode(text))
                except (msgspec.DecodeError, RecursionError):
                    continue
            except (msgspec.DecodeError, RecursionError):
                continue
            self.pos = end + 1
            return batch
        return self._batch_by_json(first_cut)

    def _batch_by_json(self, cut: int | None) -> Batch | None:
        """The window up to `cut` through the standard library's decoder, which takes what msgspec
        refuses (NaN, Infinity), leniently; where that fails too, one event at a time up to the cut."""
        if cut is None:
            return None
        try:
            loose = json.loads("[" + self.buf[self.pos : cut + 1] + "]")
        except (ValueError, RecursionError):
            self.slow_until = cut + 1
            return None
        self.pos = cut + 1
        return admitted(loose)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as f:
        magic = f.read(2)
    return _gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def read_batches(path: Path, reader: Reader) -> Iterator[Batch]:
    """The trace's events, a Batch at a time; the file's own problems become TraceError."""
    try:
        stream = _open(path)
    except OSError as err:
        raise TraceError(f"cannot read ({err.strerror or err})") from None
    reader.stream = stream
    n_events = 0
    try:
        for batch in reader.batches():
            n_events += batch.n_events
            yield batch
    except _Truncated as err:
        raise TraceError(f"truncated or malformed JSON after {n_events} events ({_first_line(err)})") from None
    except ValueError as err:
        if not reader.saw_events:
            raise TraceError(f"not a Chrome trace (no top-level traceEvents; {_first_line(err)})") from None
        raise TraceError(f"truncated or malformed JSON after {n_events} events ({_first_line(err)})") from None
    except _GZIP_ERRORS as err:
        raise TraceError(f"truncated or corrupt gzip ({err})") from None
    except OSError as err:
        raise TraceError(f"cannot read ({err.strerror or err})") from None
    finally:
        stream.close()
    if not reader.saw_events:
        raise TraceError("not a Chrome trace (no top-level traceEvents)")
