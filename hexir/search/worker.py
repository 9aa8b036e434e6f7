"""The measurement worker: a separate process that loads, checks and times one candidate at
a time, so that a candidate that crashes or hangs takes down the worker, never the search.
The CPU runner's worker loads shared libraries; the CUDA runner's loads CUBINs into the GPU's
context of its own, which a faulting kernel poisons for that process alone (the runner then
starts another).

Parent side (CpuRunner, CudaRunner):

    worker = WorkerProcess()                       # python -m hexir.search.worker <fd>
    reply = worker.call(request, timeout=30.0)     # a Reply, or WorkerDied / WorkerTimedOut
    worker.close()

The two speak pickles over a socket pair. A request carries the parent's knobs, so that
`knobs.scope(...)` in the parent holds in the worker too. The worker keeps each workload's
inputs and reference outputs in memory (a few workloads) and in a file the parent names, so a
replacement worker loads them instead of running the unscheduled kernel again.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

import hexir
from hexir import knobs
from hexir.errors import HexirError
from hexir.ir.arrays import aligned_empty
from hexir.ir.tir import PrimFunc
from hexir.runtime.cache_flush import flush_arrays
from hexir.runtime.cuda_driver import DriverError
from hexir.runtime.cuda_kernel import CudaKernel
from hexir.runtime.kernel import CpuKernel
from hexir.runtime.target import Target
from hexir.search.calibration import Calibration, load
from hexir.search.check import Arrays, mismatch, poison, random_inputs, reference, workload_seed

# Workloads whose reference a worker keeps in memory; older ones reload from their file.
MEMORY_REFERENCES = 8
# Seconds a new worker may take to import hexir and say it is ready.
STARTUP_TIMEOUT = 120.0
_ENTRY = "import sys; from hexir.search.worker import serve; serve(int(sys.argv[1]))"


@dataclass(frozen=True)
class ReferenceRequest:
    """Compute (or load) the reference of a workload: its unscheduled kernel's outputs."""

    workload_key: str
    workload: PrimFunc
    target: Target
    file: str  # an .npz file keeping the reference outputs across workers
    knobs: knobs.Knobs


@dataclass(frozen=True)
class MeasureRequest:
    """Load a built candidate, check its output against the reference, then time it: the
    shared library at `path`, or `kernel`, a CUDA candidate (its CUBIN travels with it)."""

    reference: ReferenceRequest
    func: PrimFunc
    source: str
    path: str | None
    cutoff: float | None = None  # Candidate.cutoff
    kernel: CudaKernel | None = None
    near: float | None = None  # Candidate.near


@dataclass(frozen=True)
class InTurnRequest:
    """Check several CPU candidates, each against its own workload's reference, then time
    them in turn: a call of each, then the next call of each, and so on (`time_in_turn`). The
    reply's info holds one Reply per request under "replies", in order."""

    requests: tuple[MeasureRequest, ...]


@dataclass(frozen=True)
class SourceRequest:
    """Print a CPU candidate's C (`hexir.runtime.build.c_source`): a helper's share of a
    batch (hexir/search/sources.py). The reply's info holds it under "source", or "longer":
    True where it grew past `max_lines` (printed no further)."""

    func: PrimFunc
    target: Target
    knobs: knobs.Knobs
    max_lines: int | None = None


@dataclass(frozen=True)
class Reply:
    """Latencies (seconds), or an error kind and message; `bug` is the traceback of an
    unexpected exception in the worker."""

    latencies: tuple[float, ...] = ()
    error_kind: str | None = None
    error_message: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    bug: str | None = None


class WorkerDied(Exception):
    """The worker ended while handling a request: `how` (a signal or an exit status) and the
    end of what it wrote to stderr (with faulthandler's Python stack after a crash)."""

    def __init__(self, how: str, log: str = "") -> None:
        super().__init__(how)
        self.how = how
        self.log = log


class WorkerTimedOut(Exception):
    """The worker did not answer in time; it has been killed."""


class WorkerProcess:
    """One worker process; `call` it, and make a new one after WorkerDied or WorkerTimedOut."""

    def __init__(self) -> None:
        parent, child = Pipe()
        self._stderr = tempfile.TemporaryFile()
        # The worker imports the hexir this process runs, installed or not.
        root = str(Path(hexir.__file__).resolve().parent.parent)
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        )
        fd = child.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(fd)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
        )
        child.close()
        self._conn = parent
        self.pid = self._proc.pid
        self.references: set[str] = set()  # reference files this worker has been given
        self._receive(STARTUP_TIMEOUT)

    def call(
        self, request: ReferenceRequest | MeasureRequest | SourceRequest, timeout: float
    ) -> Reply:
        """The worker's reply to `request`; raises WorkerTimedOut after `timeout` seconds
        (having killed the worker) or WorkerDied when it ends."""
        try:
            self._conn.send(request)
        except OSError:
            raise self._death() from None
        reply = self._receive(timeout)
        if not isinstance(reply, Reply):
            raise RuntimeError(f"the measurement worker answered {reply!r}")
        return reply

    def _receive(self, timeout: float) -> object:
        if not self._conn.poll(timeout):
            self.kill()
            raise WorkerTimedOut(f"no answer in {timeout:g} s")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._death() from None

    def _death(self) -> WorkerDied:
        """How the worker ended, with the end of what it wrote to stderr."""
        code = self._proc.wait()
        self._conn.close()
        if code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace")
        self._stderr.close()
        # faulthandler's list of loaded extension modules says nothing about the candidate.
        lines = [line for line in text.splitlines() if not line.startswith("Extension modules:")]
        return WorkerDied(how, "\n".join(lines).strip()[-2000:])

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._conn.close()
        self._stderr.close()

    def close(self) -> None:
        """Ask the worker to end (it exits when its end of the pipe closes), else kill it."""
        self._conn.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        self._stderr.close()


def serve(fd: int) -> None:
    """The worker's loop: answer requests until the parent closes the pipe."""
    faulthandler.enable()  # a segfault prints the Python stack to stderr, which the parent shows
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    conn = Connection(fd)
    conn.send("ready")
    references: OrderedDict[str, tuple[Arrays, Arrays]] = OrderedDict()
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        conn.send(_answer(request, references))


def _exit_with_parent(parent: int) -> None:
    # A parent killed while a candidate hangs leaves no one to kill the worker: it goes itself.
    # (ctypes lets go of the GIL during the kernel call, so this thread runs.)
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _answer(request: object, references: OrderedDict[str, tuple[Arrays, Arrays]]) -> Reply:
    try:
        match request:
            case ReferenceRequest():
                with _knobs(request.knobs):
                    _reference(request, references)
                    return Reply()
            case MeasureRequest():
                with _knobs(request.reference.knobs):
                    return _measure(request, _reference(request.reference, references))
            case InTurnRequest():
                with _knobs(request.requests[0].reference.knobs):
                    refs = [_reference(r.reference, references) for r in request.requests]
                    return _measure_in_turn(request, refs)
            case SourceRequest():
                from hexir.codegen.c import SourceTooLong
                from hexir.runtime.build import c_source

                with _knobs(request.knobs):
                    try:
                        source = c_source(request.func, request.target, request.max_lines)
                    except SourceTooLong:
                        return Reply(info={"longer": True})
                    return Reply(info={"source": source})
        raise TypeError(f"not a measurement request: {request!r}")
    except HexirError as e:
        return Reply(error_kind="run", error_message=str(e))
    except Exception:  # noqa: BLE001 - a bug: the parent raises it with this traceback
        return Reply(bug=traceback.format_exc())


def _knobs(values: knobs.Knobs):
    return knobs.scope(**{f.name: getattr(values, f.name) for f in dataclasses.fields(values)})


def _reference(
    request: ReferenceRequest, references: OrderedDict[str, tuple[Arrays, Arrays]]
) -> tuple[Arrays, Arrays]:
    """The workload's inputs and reference outputs: from memory, its file, or computed."""
    key = request.workload_key
    if key in references:
        references.move_to_end(key)
        return references[key]
    file = Path(request.file)
    if file.exists():
        inputs = random_inputs(request.workload, workload_seed(key))
        with np.load(file) as saved:
            outputs = [saved[f"out{n}"] for n in range(len(saved.files))]
    else:
        inputs, outputs = reference(request.workload, key, request.target)
        _save(file, outputs)
    references[key] = (inputs, outputs)
    if len(references) > MEMORY_REFERENCES:
        references.popitem(last=False)
    return inputs, outputs


def _save(file: Path, outputs: Arrays) -> None:
    partial = file.with_suffix(".partial.npz")
    arrays: dict[str, Any] = {f"out{n}": out for n, out in enumerate(outputs)}
    np.savez(partial, **arrays)
    os.replace(partial, file)


def _measure(request: MeasureRequest, ref: tuple[Arrays, Arrays]) -> Reply:
    if request.kernel is not None:
        return _measure_cuda(request.kernel, ref, request.cutoff)
    checked = _checked(request, ref)
    if isinstance(checked, Reply):
        return checked
    kernel, arrays, first = checked
    latencies, number = time_kernel(kernel, arrays, first, request.cutoff, request.near)
    info = _info(arrays, number)
    if request.cutoff is not None and len(latencies) == 1 and latencies[0] > request.cutoff:
        info["cut"] = True  # slower than the cutoff: timed by one warm call
    elif _far(latencies, request.near):
        info["far"] = True  # slower than `near`: timed by MIN_SLOW_REPEATS latencies
    if knobs.get().measure_calibration_threshold > 0:
        ratio = _calibration(request.reference.target).ratio()
        info["calibration_kernel"], info["calibration"] = ratio, load(ratio, latencies)
    return Reply(latencies=tuple(latencies), info=info)


def _measure_in_turn(request: InTurnRequest, refs: list[tuple[Arrays, Arrays]]) -> Reply:
    """Check each of the request's candidates against its reference (`refs`, in order); time
    those that pass in turn."""
    checked = [_checked(r, ref) for r, ref in zip(request.requests, refs, strict=True)]
    passed = [c for c in checked if not isinstance(c, Reply)]
    timed = iter(time_in_turn([(kernel, arrays) for kernel, arrays, _ in passed]))
    shared: dict[str, Any] = {"in_turn": len(passed)}
    if passed and knobs.get().measure_calibration_threshold > 0:  # once, for all of them
        shared["calibration_kernel"] = _calibration(request.requests[0].reference.target).ratio()
    replies = []
    for c in checked:
        if isinstance(c, Reply):
            replies.append(c)
            continue
        latencies, number = next(timed)
        info = {**_info(c[1], number), **shared}
        if "calibration_kernel" in shared:
            info["calibration"] = load(shared["calibration_kernel"], latencies)
        replies.append(Reply(latencies=tuple(latencies), info=info))
    return Reply(info={"replies": replies})


def _checked(
    request: MeasureRequest, ref: tuple[Arrays, Arrays]
) -> tuple[CpuKernel, list[np.ndarray], float] | Reply:
    """A CPU candidate loaded, called once on fresh (poisoned) outputs and checked: the
    kernel, its arrays and that call's seconds; or the error Reply."""
    inputs, expected = ref
    assert request.path is not None, "a CPU candidate is measured from its library"
    try:
        kernel = CpuKernel(
            request.func, request.source, Path(request.path), request.reference.target
        )
    except OSError as e:
        return Reply(error_kind="run", error_message=f"cannot load {request.path}: {e}")
    outputs = [poison(aligned_empty(e.shape, e.dtype)) for e in expected]
    start = time.perf_counter()
    kernel(*inputs, *outputs)
    first = time.perf_counter() - start
    k = knobs.get()
    problem = mismatch(outputs, expected, k.measure_rtol, k.measure_atol)
    if problem is not None:
        return Reply(error_kind="wrong_result", error_message=problem)
    return kernel, [*inputs, *outputs], first


def _info(arrays: list[np.ndarray], number: int) -> dict[str, Any]:
    """A CPU measurement's info: the worker, the calls per latency, whether timed cold."""
    info: dict[str, Any] = {"worker_pid": os.getpid(), "calls_per_latency": number}
    if is_cold(arrays):
        info["cold"] = True  # each call after the caches were emptied
    return info


def _measure_cuda(
    kernel: CudaKernel, ref: tuple[Arrays, Arrays], cutoff: float | None = None
) -> Reply:
    """Check then time a CUDA candidate (`CudaKernel.time`: the L2 flushed before each
    repeat; one launch where it is slower than `cutoff`). A driver error is a "run" reply;
    the runner then ends this worker, whose context such an error may have poisoned."""
    inputs, expected = ref
    outputs = [poison(aligned_empty(e.shape, e.dtype)) for e in expected]  # as a CPU one's
    k = knobs.get()
    try:
        kernel(*inputs, *outputs)
        problem = mismatch(outputs, expected, k.measure_rtol, k.measure_atol)
        if problem is not None:
            return Reply(error_kind="wrong_result", error_message=problem)
        latency = float(kernel.time(*inputs, *outputs, cutoff=cutoff))
    except DriverError as e:  # one the kernel's own calls did not name (a context pop)
        return Reply(error_kind="run", error_message=f"kernel {kernel.name!r}: {e}")
    info: dict[str, Any] = {"worker_pid": os.getpid()}
    if cutoff is not None and latency > cutoff:
        info["cut"] = True  # slower than the cutoff: timed by one launch
    return Reply(latencies=(latency,), info=info)


_calibrations: dict[str, Calibration] = {}


def _calibration(target: Target) -> Calibration:
    """This process's calibration kernel for `target` (hexir/search/calibration.py)."""
    if target.key not in _calibrations:
        _calibrations[target.key] = Calibration(target, knobs.get().cache_dir)
    return _calibrations[target.key]


MIN_SLOW_REPEATS = 3
# A kernel whose arrays hold more than COLD_BYTES is timed one call at a time, its arrays
# flushed from the caches before each (hexir/runtime/cache_flush.py): in a model, the kernels
# between two calls of it evict its weights. ResNet-18's Winograd batch_matmul on 7x7x512 (a
# 16 MB weight): its tuned schedule timed 0.37 ms warm and 1.97 ms cold, and ran 1.65-1.86 ms
# in the model; the default 0.53 warm, 0.93 cold. Timed warm, the tune picked the tuned one
# and the Winograd form, and the tuned model ran slower than the default one.
COLD_BYTES = 8 << 20


def is_cold(arrays: list[np.ndarray]) -> bool:
    """Whether a kernel of `arrays` is timed cold (they hold more than COLD_BYTES)."""
    return sum(a.nbytes for a in arrays) > COLD_BYTES


def time_kernel(
    kernel: CpuKernel,
    arrays: list[np.ndarray],
    first: float | None = None,
    cutoff: float | None = None,
    near: float | None = None,
) -> tuple[list[float], int]:
    """`timing_repeats` latencies, each the median of `number` calls, with `number` chosen so
    that all of them together take `timing_min_seconds`, after `timing_warmup` calls.

    A slow candidate costs less: when the call that checked it (`first` seconds) already took
    `timing_min_seconds`, it was warm-up enough and its time stands for one call; and the
    repeats stop at `timing_max_seconds` in all (at least `MIN_SLOW_REPEATS` of them). A
    candidate slower than `cutoff` seconds on its first and on one more (warm) call is timed
    by that call alone: a candidate three times slower than the best is told apart by one
    call as well as by ten. One whose first MIN_SLOW_REPEATS latencies read slower than `near`
    (their median) is timed by those: it is no rival of the best. A kernel whose arrays hold
    more than COLD_BYTES is timed cold: one call per latency, each after its arrays were
    flushed from the caches (`flush_arrays`)."""
    k = knobs.get()
    if is_cold(arrays):
        return _time_cold(kernel, arrays, first, cutoff, near), 1
    if cutoff is not None and first is not None and first > cutoff:
        with knobs.scope(timing_warmup=0, timing_repeats=1, timing_min_seconds=0.0):
            warm = kernel.time(*arrays)
        if warm > cutoff:
            return [warm], 1
    if first is not None and first >= k.timing_min_seconds:
        once = first
    else:
        with knobs.scope(timing_repeats=1, timing_min_seconds=0.0):
            once = kernel.time(*arrays)  # after the warm-up calls
    affordable = int(k.timing_max_seconds / max(once, 1e-9))
    repeats = max(min(k.timing_repeats, max(affordable, MIN_SLOW_REPEATS)), 1)
    number = min(10**6, max(1, math.ceil(k.timing_min_seconds / repeats / max(once, 1e-9))))
    latencies: list[float] = []
    with knobs.scope(timing_warmup=0, timing_repeats=number, timing_min_seconds=0.0):
        while len(latencies) < repeats and not _far(latencies, near):
            latencies.append(kernel.time(*arrays))
    return latencies, number


def _far(latencies: list[float], near: float | None) -> bool:
    """Whether `latencies` are MIN_SLOW_REPEATS and their median is slower than `near`."""
    return (
        near is not None
        and len(latencies) == MIN_SLOW_REPEATS
        and statistics.median(latencies) > near
    )


# Untimed calls of a kernel before each of its timed calls in turn (`time_in_turn`).
WARM_CALLS = 2


def time_in_turn(
    kernels: list[tuple[CpuKernel, list[np.ndarray]]],
) -> list[tuple[list[float], int]]:
    """Time `kernels`, each on its arrays, in turn: a call of each, then the next call of each,
    and so on, after `timing_warmup` turns. For each, `timing_repeats` latencies (fewer where
    the turns would pass `timing_max_seconds` a kernel, at least MIN_SLOW_REPEATS), each the
    median of `number` of its calls, `number` chosen so that all of them together take
    `timing_min_seconds` a kernel; a cold kernel's arrays (`is_cold`) are flushed before each
    of its calls, and each timed call of another is preceded by WARM_CALLS untimed ones (its
    arrays back in the caches the others' calls took, as its trials and a model's run have
    them: ResNet-18's Winograd output transform on 14x14x64, 0.055 ms in its trials and 0.064
    in the model's profile, read 0.17-0.23 ms in a tune's confirmation, in turn with its conv's
    other kernels, whose confirmed best was then a candidate twice its default's time; in turn
    with three of the model's convs and batch_matmuls, 0.16 ms, 0.12 after one untimed call,
    0.063 after two, 0.058 alone). Kernels timed one after the
    other on a host whose speed shifts from one second to the next read apart for nothing
    (the default conv and a candidate, equal to 1%, read 0.82 and 1.1 ms a second apart on a
    two-core VM); calls in turn share the shifts."""
    if not kernels:
        return []
    k = knobs.get()
    cold = [is_cold(arrays) for _, arrays in kernels]

    def turn() -> list[float]:
        times = []
        for (kernel, arrays), flush in zip(kernels, cold, strict=True):
            if flush:
                flush_arrays(arrays)
            else:
                for _ in range(WARM_CALLS):
                    kernel(*arrays)
            times.append(kernel.time(*arrays))
        return times

    with knobs.scope(timing_warmup=0, timing_repeats=1, timing_min_seconds=0.0):
        for _ in range(k.timing_warmup):
            turn()
        once = max(sum(turn()), 1e-9)  # a turn's seconds, after the warm-up
        turns = len(kernels) / once  # the turns that a second of each kernel's calls buys
        affordable = int(k.timing_max_seconds * turns)
        repeats = max(min(k.timing_repeats, max(affordable, MIN_SLOW_REPEATS)), 1)
        number = min(10**6, max(1, math.ceil(k.timing_min_seconds * turns / repeats)))
        times = [turn() for _ in range(repeats * number)]
    columns = zip(*times, strict=True)
    return [
        ([statistics.median(c[j * number : (j + 1) * number]) for j in range(repeats)], number)
        for c in columns
    ]


def _time_cold(
    kernel: CpuKernel,
    arrays: list[np.ndarray],
    first: float | None,
    cutoff: float | None,
    near: float | None = None,
) -> list[float]:
    """`timing_repeats` single calls, each after `flush_arrays` (fewer past
    `timing_max_seconds`, at least MIN_SLOW_REPEATS); one past `cutoff`, MIN_SLOW_REPEATS
    past `near`."""
    k = knobs.get()
    latencies: list[float] = []
    spent = 0.0
    past_cutoff = cutoff is not None and first is not None and first > cutoff
    with knobs.scope(timing_warmup=0, timing_repeats=1, timing_min_seconds=0.0):
        while len(latencies) < max(k.timing_repeats, 1):
            flush_arrays(arrays)
            latencies.append(kernel.time(*arrays))
            spent += latencies[-1]
            if past_cutoff and latencies[-1] > cutoff:
                break
            if len(latencies) >= MIN_SLOW_REPEATS and spent >= k.timing_max_seconds:
                break
            if _far(latencies, near):
                break
    return latencies
