"""Rewrites that make a GPU-scheduled body easy to print as CUDA C.

    body = lower_for_cuda(func.body, launch)

1. `vthread` loops become `unrolled` ones (a virtual thread is an unrolled copy of the work).
2. Reductions over a threadIdx.x loop become block-level reductions (cuda_reduce.py).
3. `lower_for_c`: blocks flattened, small unrolled loops expanded (c_lower.py).
4. Buffers placed (`place_buffers`): an allocation outside the thread loops is one per block,
   so a `global` one moves to shared memory, while a `local` one is per thread: each thread
   owns the elements whose index carries its thread (and block) indices, so the buffer
   shrinks to one thread's share, indexed by what remains (constants, once unrolled:
   registers). `C_local[ty * 8 + i, tx * 4 + j]` becomes `C_local[i, j]` of shape 8x4.
5. `__syncthreads()` inserted between stages that pass data (cuda_sync.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hexir.codegen.c_lower import lower_for_c
from hexir.codegen.cuda_reduce import lower_cross_thread
from hexir.codegen.cuda_sync import insert_syncs
from hexir.codegen.gpu_verify import BLOCK_AXES, THREAD_AXES, Launch, placement
from hexir.errors import ScheduleError
from hexir.ir.arith import affine_coefficients, bound, simplify
from hexir.ir.tir import (
    Allocate,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Expr,
    For,
    IfThenElse,
    IntImm,
    Seq,
    Stmt,
    Var,
    seq,
)
from hexir.ir.visit import map_expr, map_stmt
from hexir.schedule.cache import replace_buffer

Indices = tuple[Expr, ...]
# The bound loops around a point (var -> axis) and every loop's extent.
Env = tuple[dict[Var, str], dict[Var, int]]


def lower_for_cuda(body: Stmt, launch: Launch) -> Stmt:
    """`body` rewritten as above, ready for the CUDA printer."""
    body = map_stmt(body, stmt_fn=_vthread_to_unrolled)
    body = lower_cross_thread(body)
    body = lower_for_c(body)
    body = place_buffers(body, launch)
    return insert_syncs(body)


def _vthread_to_unrolled(stmt: Stmt) -> Stmt:
    if isinstance(stmt, For) and stmt.kind == "vthread":
        return replace(stmt, kind="unrolled")
    return stmt


# ---------------------------------------------------------------------------------------------
# Placement


def place_buffers(body: Stmt, launch: Launch) -> Stmt:
    """`body` with block-level `global` allocations in shared memory and block-level `local`
    ones shrunk to one thread's share."""
    return _place(body, ({}, {}), launch)


def _place(stmt: Stmt, env: Env, launch: Launch) -> Stmt:
    bound_vars, ranges = env
    match stmt:
        case Seq(stmts):
            return _place_seq(list(stmts), env, launch)
        case For(var, extent, kind, body):
            axes = {var: kind} if kind in THREAD_AXES or kind in BLOCK_AXES else {}
            inner = ({**bound_vars, **axes}, {**ranges, var: extent})
            return replace(stmt, body=_place(body, inner, launch))
        case Block(body=body):
            return replace(stmt, body=_place(body, env, launch))
        case IfThenElse(cond, then, else_):
            other = None if else_ is None else _place(else_, env, launch)
            return IfThenElse(cond, _place(then, env, launch), other)
    return stmt


def _place_seq(stmts: list[Stmt], env: Env, launch: Launch) -> Stmt:
    in_threads = any(axis in THREAD_AXES for axis in env[0].values())
    for n, s in enumerate(stmts):
        if not isinstance(s, Allocate):
            continue
        old = s.buffer
        where = placement(old, in_threads)
        if where == "shared" and in_threads:
            raise ScheduleError(
                f"shared buffer %{old.name} is allocated inside a thread-bound loop: shared "
                "memory belongs to the whole block; allocate it outside the thread loops",
                "generate_cuda",
            )
        rest = seq(*stmts[n + 1 :]) if n + 1 < len(stmts) else None
        if where == "shared" and old.scope != "shared":
            new = replace(old, scope="shared")
            stmts[n:] = [replace_buffer(x, old, new) for x in stmts[n:]]
        elif where == "local" and not in_threads and rest is not None:
            # Only the bound loops inside the allocation tell its instances' elements apart.
            inner: Env = ({}, env[1])
            new, project = _thread_share(old, rest, inner, launch)
            stmts[n] = Allocate(new)
            stmts[n + 1 :] = [_map_accesses(x, old, new, project, inner) for x in stmts[n + 1 :]]
    return seq(*(_place(s, env, launch) for s in stmts))


@dataclass
class _Axis:
    """One buffer axis as the accesses index it: the bound axes' coefficients, and the extent
    of what remains."""

    terms: tuple[tuple[str, int], ...] | None = None
    extent: int = 1
    rests: set[int] = field(default_factory=set)  # every value the remaining index takes


def _thread_share(
    buf: Buffer, scope: Stmt, env: Env, launch: Launch
) -> tuple[Buffer, Callable[[Indices, Env], Indices]]:
    """`buf` shrunk to one thread's share, and the map of an access's indices into it."""
    axes = [_Axis() for _ in buf.shape]

    def fail(reason: str) -> ScheduleError:
        return ScheduleError(
            f"local buffer %{buf.name} is allocated outside the thread loops, so each thread "
            f"must own its own elements, but {reason}: allocate it inside the thread loops, "
            "or give it scope shared",
            "generate_cuda",
        )

    def visit(indices: Indices, at: Env) -> Indices:
        parts = [_split_index(e, at) for e in indices]
        if any(p is None for p in parts):
            raise fail("an index is not affine in the thread indices")
        used: set[str] = set()
        for axis, (terms, rest) in zip(axes, parts, strict=True):  # type: ignore[misc]
            if axis.terms is None:
                axis.terms = terms
            elif axis.terms != terms:
                raise fail("two accesses index it by different thread indices")
            used.update(a for a, _ in terms)
            span = bound(rest, at[1])
            if span.lo is None or span.hi is None or span.lo < 0:
                raise fail(f"the index part {rest} is not provably non-negative")
            axis.extent = max(axis.extent, int(span.hi) + 1)
            axis.rests.update(range(int(span.lo), int(span.hi) + 1))
        shared_by = [a for v, a in at[0].items() if launch.dim(a) > 1 and a not in used]
        if shared_by:
            raise fail(f"threads differing only in {shared_by[0]} touch the same elements")
        return indices

    _map_accesses(scope, buf, buf, visit, env)
    _check_disjoint(axes, launch, fail)
    new = replace(buf, shape=tuple(a.extent for a in axes))

    def project(indices: Indices, at: Env) -> Indices:
        return tuple(p[1] for p in (_split_index(e, at) for e in indices))  # type: ignore[index]

    return new, project


def _split_index(e: Expr, at: Env) -> tuple[tuple[tuple[str, int], ...], Expr] | None:
    """`e` as (bound axis -> coefficient, the rest), or None where not affine in them."""
    bound_vars, ranges = at
    e = simplify(e, ranges)
    coeffs = affine_coefficients(e, list(bound_vars), ranges)
    if coeffs is None:
        return None
    rest = e
    terms = []
    for v, c in coeffs.items():
        if v is not None and c:
            rest = rest - v * IntImm(c, e.dtype)
            terms.append((bound_vars[v], c))
    return tuple(sorted(terms)), simplify(rest, ranges)


def _check_disjoint(axes: list[_Axis], launch: Launch, fail: Callable) -> None:
    """Each thread's share is its own: along every axis, no two threads' indices (the bound
    part) plus the remaining index's values meet (counted: at most a block's threads times
    the buffer's extent)."""
    seen: set[str] = set()
    for axis in axes:
        starts = {0}
        for name, coeff in axis.terms or ():
            if name in seen:
                raise fail(f"{name} indexes two of its axes")
            seen.add(name)
            starts = {s + coeff * t for s in starts for t in range(launch.dim(name))}
        hit = {s + r for s in starts for r in axis.rests}
        if len(hit) != len(starts) * len(axis.rests):
            raise fail("the shares of two threads overlap")


def _map_accesses(
    stmt: Stmt,
    old: Buffer,
    new: Buffer,
    fn: Callable[[Indices, Env], Indices],
    env: Env,
) -> Stmt:
    """`stmt` with every access to `old` made an access to `new` at `fn(indices, env)`, `env`
    describing the loops around the access."""
    bound_vars, ranges = env

    def ex(e: Expr) -> Expr:
        def load(n: Expr) -> Expr:
            if isinstance(n, BufferLoad) and n.buffer == old:
                return BufferLoad(new, fn(n.indices, env))
            return n

        return map_expr(e, load)

    match stmt:
        case For(var, extent, kind, body):
            axes = {var: kind} if kind in THREAD_AXES or kind in BLOCK_AXES else {}
            inner = ({**bound_vars, **axes}, {**ranges, var: extent})
            return replace(stmt, body=_map_accesses(body, old, new, fn, inner))
        case Seq(stmts):
            return seq(*(_map_accesses(s, old, new, fn, env) for s in stmts))
        case Block(body=body):
            return replace(stmt, body=_map_accesses(body, old, new, fn, env))
        case IfThenElse(cond, then, else_):
            other = None if else_ is None else _map_accesses(else_, old, new, fn, env)
            return IfThenElse(ex(cond), _map_accesses(then, old, new, fn, env), other)
        case BufferStore(buffer, indices, value):
            indices = tuple(ex(i) for i in indices)
            if buffer == old:
                return BufferStore(new, fn(indices, env), ex(value))
            return BufferStore(buffer, indices, ex(value))
    return stmt


__all__ = ["lower_for_cuda", "place_buffers"]
