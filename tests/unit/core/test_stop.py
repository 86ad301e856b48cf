"""hpc/core/stop.py: the stop signals, caught and handed back."""

import os
import signal

import pytest

from hpc.core.stop import StopSignal


def test_stop_signal_is_handed_back():
    before = signal.getsignal(signal.SIGUSR2)
    stop = StopSignal().install()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop.signum == signal.SIGUSR2
    stop.restore()
    assert signal.getsignal(signal.SIGUSR2) == before


@pytest.mark.parametrize("sig, stops", [(signal.SIGTERM, True), (signal.SIGUSR2, True), (signal.SIGINT, True),
                                         (signal.SIGHUP, True), (signal.SIGUSR1, False), (signal.SIGQUIT, False)])
def test_every_signal_a_job_gets_is_caught_a_stop_or_passed_on(sig, stops):
    """Each of them would end this process by default (QUIT with a core): caught, never this test's death."""
    before = signal.getsignal(sig)
    stop = StopSignal().install()
    os.kill(os.getpid(), sig)
    assert (stop.signum, stop.passed) == ((sig, []) if stops else (None, [sig]))
    stop.restore()
    assert signal.getsignal(sig) == before


def test_a_signal_caught_early_is_the_runs():
    """A door installs the handlers before its heavy imports; the run takes them over with what they caught."""
    StopSignal.take(None).restore()  # one an earlier import of a door left in this process (hpc.rank's), handed back
    before = signal.getsignal(signal.SIGTERM)
    early = StopSignal.early()
    os.kill(os.getpid(), signal.SIGTERM)
    stop = StopSignal.take(None)
    assert stop is early and stop.signum == signal.SIGTERM
    stop.restore()
    assert signal.getsignal(signal.SIGTERM) == before and StopSignal.take(None) is not early
    StopSignal.take(None).restore()
