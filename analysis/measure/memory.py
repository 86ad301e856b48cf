"""Device memory from a trace's `[memory]` instant events: peak allocated and reserved bytes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable

import numpy as np

from analysis.read.events import NO_MEMORY_ARGS, all_args, interned, out_of_range
from analysis.records import MemoryPeaks

CUDA_DEVICE_TYPES = {1, "1", "cuda", "CUDA"}


_NOT_CUDA = object()  # the device of an event on no CUDA device


def _floats(values: list) -> np.ndarray:
    return np.array(values, dtype=np.float64)  # None -> NaN


Device = Hashable  # a CUDA device's id as its events give it (an int or a string), or _NOT_CUDA


def _same(key: Device) -> Device:
    return key


class DeviceMemory:
    """`[memory]` events on CUDA devices: peak Total Allocated / Total Reserved per device, or (2021
    traces with Bytes only) the running sum from the window's start. Events arrive a window at a time,
    with their args decoded and typed (events.Args)."""

    def __init__(self) -> None:
        self.alloc: dict[Device, float] = {}
        self.reserved: dict[Device, float] = {}
        self.bytes_only: dict[Device, list[np.ndarray]] = defaultdict(list)  # per device: [ts, bytes] arrays
        self.devices: dict[Device, int] = {_NOT_CUDA: 0}  # the CUDA devices met, numbered from 1

    def _new_device(self, key: Device) -> int:
        self.devices[key] = len(self.devices)
        return self.devices[key]

    def add(self, events: list) -> int:
        """A window's `[memory]` events; returns how many carry an out-of-range number (they are skipped)."""
        if not events:
            return 0
        args = all_args(events, NO_MEMORY_ARGS)  # no args: not on a CUDA device
        ts = _floats([e.ts for e in events])
        total, reserved = _floats([a.total_allocated for a in args]), _floats([a.total_reserved for a in args])
        nbytes = _floats([a.nbytes for a in args])
        garbage = out_of_range(ts) | out_of_range(total) | out_of_range(reserved) | out_of_range(nbytes)
        keys = [a.device_id if a.device_type in CUDA_DEVICE_TYPES else _NOT_CUDA for a in args]
        device = interned(list(map(self.devices.get, keys)), keys, _same, self.devices, self._new_device)
        device[garbage] = 0
        for dev, number in self.devices.items():
            on_dev = device == number
            if number and on_dev.any():
                self._add_device(dev, ts[on_dev], total[on_dev], reserved[on_dev], nbytes[on_dev])
        return int(garbage.sum())

    def _add_device(
        self, dev: Device, ts: np.ndarray, total: np.ndarray, reserved: np.ndarray, nbytes: np.ndarray
    ) -> None:
        has_total = ~np.isnan(total)
        if has_total.any():
            self.alloc[dev] = max(self.alloc.get(dev, 0.0), float(total[has_total].max()))
            with_reserved = has_total & ~np.isnan(reserved)
            if with_reserved.any():
                self.reserved[dev] = max(self.reserved.get(dev, 0.0), float(reserved[with_reserved].max()))
        bytes_only = ~has_total & ~np.isnan(nbytes) & ~np.isnan(ts)
        if bytes_only.any():
            self.bytes_only[dev].append(np.stack([ts[bytes_only], nbytes[bytes_only]]))

    def result(self) -> MemoryPeaks:
        peak_alloc = peak_reserved = None
        relative = False
        if self.alloc:
            peak_alloc = int(max(self.alloc.values()))
            peak_reserved = int(max(self.reserved.values())) if self.reserved else None
        elif self.bytes_only:
            relative = True
            peaks = []
            for chunks in self.bytes_only.values():
                ts, nbytes = np.concatenate(chunks, axis=1)
                order = np.argsort(ts, kind="stable")
                peaks.append(float(max(0.0, np.cumsum(nbytes[order]).max())))
            peak_alloc = int(max(peaks))
        return MemoryPeaks(
            peak_gpu_mem_bytes=peak_alloc,
            peak_gpu_reserved_bytes=peak_reserved,
            gpu_mem_relative_to_window=relative if peak_alloc is not None else None,
        )
