"""Software prefetch of the next rows: what a loop annotated `software_prefetch = d` asks of
the C printer.

    for %row in 0..12288 parallel attributes {software_prefetch = 1} {
      for %k0 in 0..16 serial {                  <- each iteration prefetches the 256 bytes
        for %k1 in 0..64 vectorized { ... %in0[%row * 1024 + %k0 * 64 + %k1] ... }
      ...

While an iteration of the annotated loop runs, its first serial loop that reads an input
(a global buffer the kernel does not allocate) along that loop also prefetches the stretch
the iteration `d` further on reads there: each of its iterations the bytes it reads itself
(the input's stride along the inner loop), a cache line at a time. A row of 4 KB is a page,
and a core's hardware prefetcher stops at a page's end: each new row would start with misses
to DRAM at full latency, one row after another (softmax over 12 x 1024 x 1024: 3.8 ms; the
next row prefetched while this one's maximum is found, 2.5-2.9 ms, and 2.0 with its exps
kept in the output (c_inplace.py), in a C model of the kernel). A prefetch never faults, so
the last rows' reach past the input costs nothing; the printer guards it anyway (`row + d <
extent`), as C wants pointers inside their arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexir.ir.arith import affine_coefficients, flat_index
from hexir.ir.dtype import itemsize
from hexir.ir.tir import Allocate, Binary, Buffer, BufferLoad, Expr, For, IntImm, Var, dim_expr
from hexir.ir.visit import substitute, walk

PREFETCH = "software_prefetch"  # the loop annotation: how many iterations ahead
LINE = 64  # bytes a prefetch fetches
MAX_LINES = 8  # lines prefetched per iteration of the inner loop, at most


@dataclass(frozen=True)
class Prefetch:
    """Prefetches at the top of each iteration of an inner loop: `lines` cache lines from
    `buffer` at `indices` (the element the inner loop's iteration starts at, `d` iterations
    of the annotated loop on), under `guard`."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    lines: int
    guard: Expr


def plan(loop: For, distance: int, ranges: dict[Var, int]) -> dict[Var, list[Prefetch]]:
    """The prefetches `loop` (annotated `distance` ahead) asks of its first serial loop that
    reads an input along it, by that loop's var; empty where there is none."""
    allocated = {s.buffer for s in walk(loop.body) if isinstance(s, Allocate)}
    for inner in (n for n in walk(loop.body) if isinstance(n, For) and n.kind == "serial"):
        loops = [loop, inner, *(f for f in walk(inner.body) if isinstance(f, For))]
        fixed = {f.var: f.extent for f in loops if isinstance(f.extent, int)}
        scope = {**ranges, **{v: fixed[v] for v in (loop.var, inner.var) if v in fixed}}
        inside = {v: e for v, e in fixed.items() if v not in (loop.var, inner.var)}
        found = []
        for load in _loads(inner, allocated):
            offset = flat_index(load.buffer, load.indices)
            coeffs = affine_coefficients(offset, [loop.var, inner.var], {**scope, **inside})
            if coeffs is None or coeffs[loop.var] == 0 or coeffs[inner.var] <= 0:
                continue
            step = coeffs[inner.var] * itemsize(load.buffer.dtype)
            ahead = {loop.var: Binary("+", loop.var, IntImm(distance, loop.var.dtype))}
            start = {v: IntImm(0, v.dtype) for v in inside}
            indices = tuple(substitute(i, {**ahead, **start}) for i in load.indices)
            guard = Binary("<", loop.var, dim_expr(loop.extent - distance, loop.var.dtype))
            lines = min(MAX_LINES, -(-step // LINE))
            found.append(Prefetch(load.buffer, indices, lines, guard))  # type: ignore[arg-type]
        if found:
            return {inner.var: list({p.buffer: p for p in found}.values())}
    return {}


def _loads(loop: For, allocated: set[Buffer]) -> list[BufferLoad]:
    return [
        n
        for n in walk(loop.body)
        if isinstance(n, BufferLoad) and n.buffer.scope == "global" and n.buffer not in allocated
    ]
