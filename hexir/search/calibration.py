"""The calibration kernel: a small parallel matmul timed beside every CPU candidate, so that a
time measured while something else ran on the machine is known for what it is.

    calibration = Calibration(Target("cpu"), cache_dir)    # built once per worker process
    ratio = calibration.ratio()    # its time now / its quiet time: 1.0 quiet, 2.0 half the CPU
    figure = load(ratio, latencies)  # or the candidate's median / its fastest, where larger

A candidate is an OpenMP kernel on every core: while another process runs, its threads are
descheduled and it can take ten times its quiet time (a 128^3 matmul recorded at 4.4 ms, for
tens of microseconds). The calibration kernel, timed right after the candidate, is slowed by
the same load. Its quiet time is the fastest it was timed on this machine, kept in
`<cache_dir>/calibration/` (keyed by its C source, so a new codegen starts over) for the
processes of a tune, and settled again where none is kept or the one kept has not been
bettered for STALE_SECONDS: the first Calibration made then takes the fastest of
SETTLE_READINGS readings. A machine's speed drifts (a virtual machine's neighbours, its clock;
this 2-core host's numpy matmul reads 150 to 490 GFLOP/s from one hour to the next), and a
quiet time from a faster hour would call every time of a slower one loaded. A Ray executor
makes one in the driver before its cluster starts (hexir/search/distributed.py): the first
candidates are timed while the workers start up, and a quiet time read then would be a loaded
one, against which the loaded times look quiet. A result whose ratio passes the
`measure_calibration_threshold` knob is suspect: the tune measures it again later, and the
database prefers the quiet records (hexir/search/tune.py, hexir/database/queries.py).

A load that comes and goes while the candidate is timed can be gone when the calibration
kernel runs right after it. The candidate's own latencies show it: a quiet kernel's repeats
read within a few percent of each other, and one timed under such a load reads some at its
quiet time and the rest several times slower. So the figure a result carries is `load`: the
calibration kernel's ratio, or the candidate's median over its fastest latency where that is
larger. ResNet-18's first conv (1.8 ms quiet), confirmed in turn with its default while
something else ran: one run's latencies 2.0 to 15.7 ms, median 4.6, its calibration ratio
1.04; the confirmation ranked the two at 5.9 and 7.2 ms, and the build took the candidate
that ran 0.90x the default's speed in the model. Of three 2000-trial ResNet-18 tunes' 9614
records, 12 read a median past twice their fastest latency where their calibration ratio
read quiet, seven of them that confirmation's.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hexir import knobs
from hexir.runtime.target import Target

# The kernel: a matmul big enough to need every core (tens of microseconds a call), small enough
# that timing it costs a few milliseconds per candidate.
SIZE = 128
# Timing: REPEATS medians of calls that take at least REPEAT_SECONDS together.
REPEATS = 5
REPEAT_SECONDS = 0.0005
# The readings that settle a quiet time where none is kept (its first calls also warm the
# thread pool up).
SETTLE_READINGS = 10
# A quiet time not bettered for this long is settled again (see the module).
STALE_SECONDS = 600.0


class Calibration:
    """The calibration kernel of one CPU target, built, with its quiet time."""

    def __init__(self, target: Target, cache_dir: str | Path) -> None:
        import hexir
        from hexir.runtime.default_schedule import default_schedule

        func = hexir.workload("matmul", M=SIZE, N=SIZE, K=SIZE)
        self.kernel = hexir.build(default_schedule(func, target).func, target)
        rng = np.random.default_rng(0)
        self.arrays = [rng.standard_normal(p.shape).astype(p.dtype) for p in func.params]
        digest = hashlib.sha256(self.kernel.source.encode()).hexdigest()[:16]
        self.file = Path(cache_dir) / "calibration" / f"{target.key}-{digest}.json"
        self.quiet = _read_quiet(self.file)
        if self.quiet is None:
            self.settle()

    def settle(self, readings: int = SETTLE_READINGS) -> float:
        """Time the kernel `readings` times and keep the fastest as the quiet time where none
        is kept or it is faster than the one kept; return the quiet time."""
        fastest = min(self.seconds() for _ in range(readings))
        if self.quiet is None or fastest < self.quiet:
            self.quiet = fastest
            _save(self.file, fastest)
        return self.quiet

    def seconds(self) -> float:
        """The kernel's time now: the median of REPEATS timings, each over enough calls."""
        with knobs.scope(timing_warmup=1, timing_repeats=1, timing_min_seconds=0.0):
            once = self.kernel.time(*self.arrays)
        number = max(1, int(REPEAT_SECONDS / max(once, 1e-9)))
        with knobs.scope(timing_warmup=0, timing_repeats=number, timing_min_seconds=0.0):
            return statistics.median(self.kernel.time(*self.arrays) for _ in range(REPEATS))

    def ratio(self) -> float:
        """The kernel's time now over its quiet time (at least 1.0: a faster time becomes the
        quiet one, and is kept for the next process)."""
        now = self.seconds()
        if self.quiet is None or now < self.quiet:
            self.quiet = now
            _save(self.file, now)
        return now / self.quiet


def load(ratio: float, latencies: Sequence[float]) -> float:
    """The load figure of a measurement (see the module): the calibration kernel's `ratio`
    right after it, or the measurement's median over its fastest latency where larger."""
    if not latencies:
        return ratio
    return max(ratio, statistics.median(latencies) / min(latencies))


def _read_quiet(file: Path) -> float | None:
    """The quiet time kept in `file`; None where there is none, or it is stale."""
    try:
        data = json.loads(file.read_text())
        value, settled = data["quiet_seconds"], data["settled"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    numbers = all(isinstance(v, int | float) for v in (value, settled))
    if not numbers or value <= 0 or time.time() - settled > STALE_SECONDS:
        return None
    return float(value)


def _save(file: Path, seconds: float) -> None:
    """Write the quiet time, and when, atomically (several workers may write at once)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(f"{file.name}.{os.getpid()}.{time.monotonic_ns()}")
    partial.write_text(json.dumps({"quiet_seconds": seconds, "settled": time.time()}))
    os.replace(partial, file)
