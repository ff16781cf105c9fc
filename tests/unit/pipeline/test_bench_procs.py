"""What ``freshkey bench pipeline`` charges a process: its CPU time, read to the nanosecond (a worker's
share of a small drain is 10-30 ms, which ``/proc/<pid>/stat``'s 10 ms clock ticks read as 0, 1 or 2)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pipeline.bench.procs import Sampler, cpu_seconds

BURN_S = 0.003
CHILD = textwrap.dedent(
    f"""
    import sys, time
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.process_time()
    while time.process_time() - start < {BURN_S}:
        pass
    print("done", flush=True)
    sys.stdin.readline()
    """
)


def test_a_few_milliseconds_of_another_process_are_measured_not_rounded_to_a_clock_tick() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"  # started, and waiting
        sampler = Sampler({"child": child.pid})
        sampler.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        figures = sampler.stop()
    finally:
        child.stdin.close()
        child.wait(timeout=10)
        child.stdout.close()
    # Its 3 ms of CPU and a little for reading and writing a line: neither 0 nor a 10 ms clock tick.
    assert BURN_S <= figures["child"]["cpu_s"] < 0.009, figures
    assert cpu_seconds(child.pid) is None  # gone and reaped
