"""hpc/launch/rank/pump.py: a task's stream copied, as it comes, into the rank's log and on to the runner's
own stream. The oracle is what a real child process wrote (its bytes, counted here) read back from both
ends; a closed runner stream (a terminal gone) must not stop the copy into the log."""

import os
import subprocess
import sys
import threading

from hpc.launch.rank.pump import Pump

WRITER = ("import os, sys\n"
          "for i in range(int(sys.argv[1])):\n"
          "    os.write(1, bytes([i % 256]) * (i % 977 + 1))\n")  # binary, uneven chunks, no newline needed


def expected(n: int) -> bytes:
    return b"".join(bytes([i % 256]) * (i % 977 + 1) for i in range(n))


def drain(fd: int, into: bytearray) -> threading.Thread:
    def read() -> None:
        while chunk := os.read(fd, 1 << 16):
            into.extend(chunk)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_every_byte_reaches_the_log_and_the_runners_stream(tmp_path):
    n = 2000  # about 1 MB: many of the pump's reads
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(n)], stdout=subprocess.PIPE)
    passed_r, passed_w = os.pipe()
    passed = bytearray()
    reader = drain(passed_r, passed)
    (tmp_path / "rank0.out").write_bytes(b"an earlier start\n")  # a requeued run's log goes on after it
    pump = Pump(proc.stdout, tmp_path / "rank0.out", passed_w)
    assert proc.wait(timeout=60) == 0
    pump.finish()
    os.close(passed_w)
    reader.join(10)
    assert (tmp_path / "rank0.out").read_bytes() == b"an earlier start\n" + expected(n)
    assert bytes(passed) == expected(n)
    assert not pump.thread.is_alive() and proc.stdout.closed


def test_a_closed_runner_stream_does_not_stop_the_log(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, "300"], stdout=subprocess.PIPE)
    passed_r, passed_w = os.pipe()
    os.close(passed_r)  # nobody reads the runner's stream any more: writes to it fail (EPIPE)
    pump = Pump(proc.stdout, tmp_path / "rank1.err", passed_w)
    assert proc.wait(timeout=60) == 0
    pump.finish()
    os.close(passed_w)
    assert (tmp_path / "rank1.err").read_bytes() == expected(300)


def test_finish_waits_only_so_long_for_a_pipe_a_grandchild_holds(tmp_path):
    """A task whose child keeps the pipe open: finish() returns after its timeout and leaves the pipe."""
    read_end, write_end = os.pipe()
    source = os.fdopen(read_end, "rb")
    pump = Pump(source, tmp_path / "rank0.out", os.open(os.devnull, os.O_WRONLY))
    os.write(write_end, b"still here\n")
    pump.finish(timeout_s=0.3)
    assert pump.thread.is_alive() and not source.closed  # the holder still has it
    os.close(write_end)
    pump.finish()
    assert not pump.thread.is_alive() and source.closed
    assert (tmp_path / "rank0.out").read_bytes() == b"still here\n"
