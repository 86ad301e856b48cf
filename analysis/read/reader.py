"""Streaming a Chrome/Kineto trace file: its top-level values, and its events a window at a time.

`read_batches(path, reader)` yields `Batch`es (events.py): the events of about a megabyte of the file,
decoded in one call. The file's own problems (truncated, not a trace, corrupt gzip) become one
TraceError. No torch import.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from analysis.read.events import Batch, admitted, lenient, typed
from hpc.core.errors import TraceError

_gzip: types.ModuleType
try:  # Intel's ISA-L (python-isal) inflates gzip about 3x faster than zlib; zlib where it is not installed
    from isal import igzip as _gzip
    from isal.isal_zlib import error as _IsalError

    _GZIP_ERRORS: tuple[Any, ...] = (EOFError, zlib.error, gzip.BadGzipFile, _IsalError)
except ImportError:
    _gzip, _GZIP_ERRORS = gzip, (EOFError, zlib.error, gzip.BadGzipFile)


class _Truncated(Exception):
    pass


# What one trace may cost, whatever it holds (a file past a bound is refused in one line, in seconds):
MAX_VALUE_BYTES = 64 << 20  # one event, or one top-level value, as text: real events are under a kilobyte
MAX_BLANK_BYTES = 16 << 20  # whitespace between two values: real traces have a few bytes there
MAX_INFLATION = 100  # a .gz inflating past 100x its size (real traces: 10-20x), once past BOMB_FLOOR_BYTES
BOMB_FLOOR_BYTES = 256 << 20
_NOT_BLANK = re.compile(r"[^ \t\n\r]")


class _TooCostly(Exception):
    """A trace past one of the bounds above: str() says which."""


class Reader:
    """Stream a Chrome trace's top-level object: every top-level value but `traceEvents` is decoded
    whole (they are small: metadata, kept in `meta`), the events a window at a time.

    Written here rather than taken from a streaming-JSON library because measured on the real traces
    it is faster: a window of events is one msgspec call (`_batch`); ijson's yajl backend spent most of
    the analysis time tokenising. Memory is the window (1 MiB chunks) and its events.
    """

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
        self.read_bytes = 0  # of text, inflated: held against `max_bytes`
        self.max_bytes: int | None = None  # set for a .gz (see MAX_INFLATION)

    def _fill(self) -> bool:
        if self.eof:
            return False
        assert self.stream is not None, "Reader.stream is set before reading"
        data = self.stream.read(self.chunk)
        self.read_bytes += len(data)
        if self.max_bytes is not None and self.read_bytes > self.max_bytes:
            raise _TooCostly(f"inflates past {self.max_bytes >> 20} MiB, over {MAX_INFLATION}x its size: a gzip bomb")
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
        blank = 0
        while True:
            found = _NOT_BLANK.search(self.buf, self.pos)
            if found is not None:
                self.pos = found.start()
                return self.buf[self.pos]
            blank += len(self.buf) - self.pos
            self.pos = len(self.buf)
            if blank > MAX_BLANK_BYTES:
                raise _TooCostly(f"more than {MAX_BLANK_BYTES >> 20} MiB of whitespace in a row")
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
            except RecursionError:
                raise _TooCostly("values nested deeper than Python's JSON decoder goes") from None
            except json.JSONDecodeError as err:
                if len(self.buf) - self.pos > MAX_VALUE_BYTES:
                    raise _TooCostly(f"a value (an event) longer than {MAX_VALUE_BYTES >> 20} MiB") from None
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
                batch = typed(text)
            except msgspec.ValidationError:
                try:
                    batch = lenient(text)
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


def _open(path: Path) -> tuple[IO[bytes], bool]:
    """The file's text as a stream, and whether it is gzip's."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return (_gzip.open(path, "rb") if gz else open(path, "rb")), gz


def read_batches(path: Path, reader: Reader) -> Iterator[Batch]:
    """The trace's events, a Batch at a time; the file's own problems become TraceError."""
    try:
        stream, gz = _open(path)
        if gz:
            reader.max_bytes = max(BOMB_FLOOR_BYTES, MAX_INFLATION * os.path.getsize(path))
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
    except _TooCostly as err:
        raise TraceError(f"refused after {n_events} events: {err} (the bounds: analysis/read/reader.py)") from None
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
