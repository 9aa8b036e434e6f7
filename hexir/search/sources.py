"""Printing a batch of candidates' C at once: this process and helper processes side by side.

    print_sources(candidates)      # each CPU candidate's c_source made, shares by helpers

Generating C is Python work, so one process prints one kernel at a time; the search reads the
C of every candidate it proposes (their size, `EvolutionarySearch.source_limit`) before a
builder compiles it. With more than one core, helper processes (the measurement worker's
kind, hexir/search/worker.py: `python -c`, so a user's script is never run again in them;
started on first use and kept) print a share of the batch while this process prints the rest.
Best effort: a candidate a helper does not return (it died, timed out, or the printing
raised) is printed where its C is first read, in this process, raising there as it would.
"""

from __future__ import annotations

import atexit
import threading
from collections import deque
from collections.abc import Sequence

from hexir import knobs
from hexir.errors import HexirError
from hexir.runtime.target import Target
from hexir.search.measure import Candidate
from hexir.search.worker import SourceRequest, WorkerDied, WorkerProcess, WorkerTimedOut

__all__ = ["print_sources"]

# Seconds a helper may take to print one kernel (the largest take about two).
PRINT_TIMEOUT = 120.0

_helpers: list[WorkerProcess | None] = []
_lock = threading.Lock()


def print_sources(
    candidates: Sequence[Candidate], helpers: int | None = None, max_lines: int | None = None
) -> None:
    """Make the `c_source` of each CPU candidate that has none, `helpers` processes (None:
    one per core but this one's, from the `build_workers` knob, 0 = one per core) printing
    beside this one. With `max_lines`, a C that grows past it is printed no further: its
    candidate is marked longer (`Candidate.mark_longer`) and keeps no C."""
    todo = deque(c for c in candidates if c.target.kind == "cpu" and not c.has_source
                 and not (max_lines is not None and c.longer_than(max_lines)))  # fmt: skip
    if helpers is None:
        helpers = (knobs.get().build_workers or Target("cpu").num_cores) - 1
    helpers = min(helpers, len(todo) - 1)
    threads = []
    if helpers > 0:
        values = knobs.get()  # the knobs of this context: a helper thread has its own
        threads = [threading.Thread(target=_help, args=(n, todo, values, max_lines), daemon=True)
                   for n in range(helpers)]  # fmt: skip
        for t in threads:
            t.start()
    while todo:
        try:
            candidate = todo.popleft()
        except IndexError:
            break
        if max_lines is not None:
            candidate.fits(max_lines)  # printed that far, and kept where it fits
            continue
        try:
            candidate.c_source  # noqa: B018 - made and kept
        except HexirError:
            pass  # raised again where its C is read
    for t in threads:
        t.join()


def _help(n: int, todo: deque[Candidate], values: knobs.Knobs, max_lines: int | None) -> None:
    """Helper `n`'s share: print candidates from `todo` until it is empty."""
    worker = _helper(n)
    if worker is None:
        return
    while True:
        try:
            candidate = todo.popleft()
        except IndexError:
            return
        try:
            request = SourceRequest(candidate.func, candidate.target, values, max_lines)
            reply = worker.call(request, PRINT_TIMEOUT)
        except (WorkerDied, WorkerTimedOut):
            with _lock:
                _helpers[n] = None  # started again when next asked
            todo.append(candidate)
            return
        source = reply.info.get("source")
        if isinstance(source, str):
            candidate.keep_source(source)
        elif max_lines is not None and reply.info.get("longer"):
            candidate.mark_longer(max_lines)


def _helper(n: int) -> WorkerProcess | None:
    """Helper process `n`, started when there is none (None when it does not start)."""
    with _lock:
        while len(_helpers) <= n:
            _helpers.append(None)
        worker = _helpers[n]
    if worker is not None:
        return worker
    try:
        worker = WorkerProcess()
    except (OSError, WorkerDied, WorkerTimedOut):
        return None
    with _lock:
        _helpers[n] = worker
    return worker


@atexit.register
def close_helpers() -> None:
    """End the helper processes (they also end with this process)."""
    with _lock:
        workers, _helpers[:] = list(_helpers), []
    for worker in workers:
        if worker is not None:
            worker.close()
