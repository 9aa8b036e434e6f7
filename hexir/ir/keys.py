"""Workload and candidate keys: the SHA-256 of a PrimFunc's canonical text (DESIGN.md §2).

The canonical text is the printer's output with names normalized: the func is `@f`, buffers
`b0, b1, ...` and vars `v0, v1, ...` in the order the printer declares them, attrs left out.
Block names stay: traces find blocks by name, so they are part of what a trace replays on.
The key depends on the text alone, never on hashing or dict order, so it is the same in every
process. Changing the canonical text changes every key: that is a database migration.
"""

from __future__ import annotations

import hashlib

from hexir.ir.kept import kept
from hexir.ir.tir import PrimFunc
from hexir.ir.tir_text import print_canonical


def workload_key(func: PrimFunc) -> str:
    """The key of an unscheduled PrimFunc: equal for funcs that differ only in names or attrs.
    Within `hexir.ir.kept.keeping`, printed once per func object: a build with a database keys
    the same lowered kernels again and again as it weighs its convs' forms (ResNet-18: 856
    keys of about 450 func objects, 5 ms a print)."""
    return kept(("workload_key",), (func,), lambda: _digest(func))


def _digest(func: PrimFunc) -> str:
    return hashlib.sha256(print_canonical(func).encode("utf-8")).hexdigest()


def candidate_key(func: PrimFunc) -> str:
    """The key of a scheduled PrimFunc (the same digest; the schedule is in the loops' kinds)."""
    return workload_key(func)
