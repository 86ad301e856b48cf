"""A training loop that stops the way PyTorch Lightning's does under Slurm: SIGTERM is logged and bypassed
(`Bypassing SIGTERM`), the loop then ends early and the script returns normally (exit 0) without having
finished; SIGUSR1 (Lightning's requeue signal) and SIGQUIT are logged and the loop goes on. Each signal
it gets is one line on stdout, so a test can see what reached it. No torch: the signals are the point."""

import argparse
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=600)
parser.add_argument("--step-s", type=float, default=0.1)
args = parser.parse_args()
stop = False


def bypass(signum, frame):
    global stop
    print(f"got {signal.Signals(signum).name}: Bypassing SIGTERM", flush=True)
    stop = True


def logged(signum, frame):
    print(f"got {signal.Signals(signum).name}", flush=True)


signal.signal(signal.SIGTERM, bypass)
for sig in (signal.SIGUSR1, signal.SIGQUIT):
    signal.signal(sig, logged)
print(f"rank {os.environ.get('RANK', '0')} started, pid {os.getpid()}", flush=True)
for step in range(args.steps):
    if stop:
        print(f"stopping early at step {step}", flush=True)
        break
    time.sleep(args.step_s)
else:
    print("finished", flush=True)
