"""What a model build keeps between processes beside its compiled libraries (`cc/`,
hexir/runtime/cc.py): each kernel's C (`src/`), and its schedule (`schedules/`: the default
one, or the one a tuned kernel's record replays to), in the build cache (`HEXIR_CACHE_DIR`),
under digests of what they are made from and of Hexir's own code, so that a model built
again neither schedules nor prints its kernels again.

    source = cached_c_source(func, target)             # build.c_source, printed once
    func, trace = cached_default_schedule(func, target)  # default_schedule, made once
    func, trace = cached_replay(func, record_trace)      # trace.apply(func), replayed once

A schedule is kept pickled: the cache is trusted as the libraries in it are (a process loads
and runs them). A process that replaces part of the code generator or of the default
schedules at run time (a test's monkeypatch) may read what was made without it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hexir import knobs

if TYPE_CHECKING:  # annotations only: hexir/runtime/nvrtc.py imports this module's writer
    from hexir.ir.tir import PrimFunc
    from hexir.runtime.target import Target
    from hexir.schedule import Schedule
    from hexir.schedule.trace import Trace

__all__ = ["cached_c_source", "cached_default_schedule", "cached_replay", "write_atomic"]


def cached_c_source(func: PrimFunc, target: Target) -> str:
    """`c_source(func, target)` (hexir/runtime/build.py), printed where this function, target,
    `HEXIR_VECTOR_MATH` (the knob it reads) and code have not printed it before (ResNet-18's
    49 kernels: 6 s to print)."""
    from hexir.runtime.build import c_source

    vector_math = f"vector_math={knobs.get().vector_math}"
    path = _entry("src", ".c", repr(func), repr(target), vector_math)
    return _kept(path, lambda: c_source(func, target).encode()).decode()


def cached_default_schedule(func: PrimFunc, target: Target) -> tuple[PrimFunc, Trace]:
    """`default_schedule(func, target)`'s function and trace, made where this function,
    target and code have not made them before (ResNet-18's 49 kernels: 1.8 s to schedule,
    0.07 s to load)."""
    from hexir.runtime.default_schedule import default_schedule

    path = _entry("schedules", ".pickle", "default", repr(func), repr(target))
    return _schedule(path, lambda: default_schedule(func, target))


def cached_replay(func: PrimFunc, trace: Trace) -> tuple[PrimFunc, Trace]:
    """`trace.apply(func)`'s function and trace (a tuned build's record), replayed where this
    function, trace and code have not replayed them before; a trace that does not replay
    raises its ScheduleError every time (nothing is kept)."""
    path = _entry("schedules", ".pickle", "replay", repr(func), trace.to_json())
    return _schedule(path, lambda: trace.apply(func))


def _schedule(path: Path, make: Callable[[], Schedule]) -> tuple[PrimFunc, Trace]:
    """The (function, trace) kept at `path`, else `make()`'s, kept there."""

    def made() -> bytes:
        sch = make()
        return pickle.dumps((sch.func, sch.trace))

    try:
        scheduled, trace = pickle.loads(_kept(path, made))
    except (pickle.UnpicklingError, EOFError):  # an entry damaged outside Hexir: made again
        path.unlink(missing_ok=True)
        scheduled, trace = pickle.loads(_kept(path, made))
    return scheduled, trace


def _entry(folder: str, suffix: str, *parts: str) -> Path:
    """The path of the cache entry of `parts` (and of Hexir's code) in `folder`."""
    digest = hashlib.sha256()
    for part in (*parts, _code_digest()):
        digest.update(hashlib.sha256(part.encode()).digest())
    return Path(knobs.get().cache_dir).expanduser() / folder / f"{digest.hexdigest()}{suffix}"


def _kept(path: Path, make: Callable[[], bytes]) -> bytes:
    """The bytes at `path`, or `make()`'s, written there whole (another process may read it)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    data = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return data


def write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, written under a temporary name and renamed (a concurrent reader sees
    all or nothing), readable by others (a shared cache); no temporary file left on failure."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep a shared cache from others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@functools.cache
def _code_digest() -> str:
    """A digest of Hexir's Python sources, once per process (20 ms): what other code made is
    another entry."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
