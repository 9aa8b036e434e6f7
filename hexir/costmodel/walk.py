"""One pass over a scheduled PrimFunc that gathers what the features need, per buffer store.

For every `BufferStore` it records the loops around it (extent, kind, unroll step), the
arithmetic of the stored value, and every buffer access (the store and each load) as an affine
map from loop depths to buffer axes: `coefs[axis][depth]` is how far the index of `axis` moves
when the loop at `depth` steps by one. Block iter vars are replaced by their bindings on the
way down, so an access reads in terms of the loops, whatever the block's own names.

Index expressions that are not affine are approximated the way a cache would see them:
`floordiv(x, c)` moves by 1/c per step of x, `floormod(x, c)` like x, `min`/`max` like
their non-constant operand; anything else (an indirect index) counts as not moving.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from hexir.ir.dtype import is_float
from hexir.ir.tir import (
    AUTO_UNROLL_KEY,
    Allocate,
    Barrier,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Call,
    Cast,
    Expr,
    FloatImm,
    For,
    IfThenElse,
    IntImm,
    PrimFunc,
    Select,
    Seq,
    Stmt,
    Unary,
    Var,
)

# Arithmetic kinds counted per store (one evaluation of the stored value). FMA counts the
# float additions with a float product as an operand: a compiler fuses those. compare_select
# counts float comparisons and selects (a mask and a blend per vector), int_compare the
# integer comparisons and logic of guards (a padded copy's bounds), which codegen partitions
# out of the loops or GCC hoists.
OP_KINDS = (
    "float_add", "float_mul", "float_fma", "float_div", "float_minmax", "float_math",
    "compare_select", "cast", "int_index", "int_compare",
)  # fmt: skip
_ADD, _MUL, _FMA, _DIV, _MINMAX, _MATH, _CMP, _CAST, _INT, _ICMP = range(len(OP_KINDS))

Affine = tuple[dict[int, float], float]  # (coefficient per loop depth, constant)
# Vars are looked up by name: a name is bound once per scope in a PrimFunc, and a string
# hashes and compares far faster than a dataclass.
Env = dict[str, Affine]
_ZERO: Affine = ({}, 0.0)


class Loop(NamedTuple):
    """A loop around a store: its extent, kind and the auto-unroll step annotated on it."""

    extent: int
    kind: str
    unroll_step: int


class Access(NamedTuple):
    """One access of a buffer by a store: `coefs[axis]` maps loop depth -> index step."""

    buffer: Buffer
    is_write: bool
    coefs: tuple[dict[int, float], ...]
    moves: frozenset[int]  # the depths of the loops that move it


@dataclass(slots=True)
class Store:
    """A buffer store with its context: `loops` outermost first (the For nodes themselves in
    `nodes`, to find the loops two stores share), its accesses and its op counts per
    evaluation; `trips` is the product of the loops' extents."""

    loops: tuple[Loop, ...]
    extents: list[int]
    trips: float
    nodes: tuple[For, ...]
    accesses: list[Access]
    ops: list[int]
    in_init: bool
    in_reduction: bool
    predicated: bool


@dataclass(slots=True)
class KernelWalk:
    """Everything one walk found: the stores in program order, the allocations, the number of
    blocks, barriers and loop nests at the root."""

    stores: list[Store] = field(default_factory=list)
    allocations: list[Buffer] = field(default_factory=list)
    blocks: int = 0
    barriers: int = 0
    root_nests: int = 0


def walk_kernel(func: PrimFunc) -> KernelWalk:
    """Gather the stores, allocations and counts of `func` (see the module docstring)."""
    walker = _Walker()
    body = func.body
    roots = body.stmts if isinstance(body, Seq) else (body,)
    walker.out.root_nests = sum(1 for s in roots if isinstance(s, For))
    walker.visit(body)
    return walker.out


class _Walker:
    def __init__(self) -> None:
        self.out = KernelWalk()
        self.loops: list[Loop] = []
        self.nodes: list[For] = []
        self.env: Env = {}
        self.in_init = False
        self.in_reduction = False
        self.predicated = 0

    def visit(self, stmt: Stmt) -> None:
        match stmt:
            case For(var, extent, kind, body, annotations):
                step = 0
                for key, value in annotations:
                    if key == AUTO_UNROLL_KEY and isinstance(value, int):
                        step = value
                self.env[var.name] = ({len(self.loops): 1.0}, 0.0)
                self.loops.append(Loop(extent, kind, step))
                self.nodes.append(stmt)
                self.visit(body)
                self.loops.pop()
                self.nodes.pop()
            case Block():
                self._block(stmt)
            case BufferStore():
                self._store(stmt)
            case Seq(stmts):
                for s in stmts:
                    self.visit(s)
            case IfThenElse(_, then, else_):
                self.predicated += 1
                self.visit(then)
                if else_ is not None:
                    self.visit(else_)
                self.predicated -= 1
            case Allocate(buffer):
                self.out.allocations.append(buffer)
            case Barrier():
                self.out.barriers += 1

    def _block(self, block: Block) -> None:
        self.out.blocks += 1
        for iv in block.iter_vars:
            self.env[iv.var.name] = affine(iv.binding, self.env)
        saved = self.in_reduction, self.in_init
        self.in_reduction = any(iv.kind == "reduce" for iv in block.iter_vars)
        self.predicated += block.predicate is not None
        if block.init is not None:
            self.in_init = True
            self.visit(block.init)
            self.in_init = saved[1]
        self.visit(block.body)
        self.predicated -= block.predicate is not None
        self.in_reduction, self.in_init = saved

    def _store(self, store: BufferStore) -> None:
        ops = [0] * len(OP_KINDS)
        accesses = [self._access(store.buffer, store.indices, True, ops)]
        self._count(store.value, ops, accesses)
        extents = [lp.extent for lp in self.loops]
        trips = math.prod(extents)
        if self.in_init:
            # An init runs once per output element: the loops that do not move its output
            # are reduction loops, run through once.
            moves = accesses[0].moves
            trips = math.prod(e for d, e in enumerate(extents) if d in moves)
        self.out.stores.append(
            Store(
                tuple(self.loops),
                extents,
                float(trips),
                tuple(self.nodes),
                accesses,
                ops,
                self.in_init,
                self.in_reduction,
                self.predicated > 0,
            )
        )

    def _access(
        self, buffer: Buffer, indices: tuple[Expr, ...], is_write: bool, ops: list[int]
    ) -> Access:
        coefs = []
        moves: set[int] = set()
        for index in indices:
            ops[_INT] += _int_ops(index)
            axis = affine(index, self.env)[0]
            coefs.append(axis)
            moves.update(d for d, k in axis.items() if k)
        return Access(buffer, is_write, tuple(coefs), frozenset(moves))

    def _count(self, expr: Expr, ops: list[int], accesses: list[Access]) -> None:
        """Count the arithmetic of a stored value by kind, and collect its loads."""
        match expr:
            case BufferLoad(buffer, indices):
                accesses.append(self._access(buffer, indices, False, ops))
                return
            case Binary(op, a, b):
                _count_binary(op, a, b, ops)
                self._count(a, ops, accesses)
                self._count(b, ops, accesses)
            case Unary(_, a):
                self._count(a, ops, accesses)
            case Call(_, args):
                ops[_MATH] += 1
                for arg in args:
                    self._count(arg, ops, accesses)
            case Select(cond, then, else_):
                ops[_CMP] += 1
                for e in (cond, then, else_):
                    self._count(e, ops, accesses)
            case Cast(_, value):
                ops[_CAST] += 1
                self._count(value, ops, accesses)


def _count_binary(op: str, a: Expr, b: Expr, ops: list[int]) -> None:
    if not is_float(a.dtype):
        # Integer arithmetic inside a value (not an index) is rare; a guard compares.
        ops[_ICMP if op in ("==", "!=", "<", "<=", ">", ">=", "&&", "||") else _INT] += 1
        return
    if op in ("+", "-"):
        fused = _is_float_mul(a) or _is_float_mul(b)
        ops[_FMA if fused else _ADD] += 1
    elif op == "*":
        ops[_MUL] += 1
    elif op in ("/", "pow"):
        ops[_DIV] += 1
    elif op in ("min", "max"):
        ops[_MINMAX] += 1
    else:
        ops[_CMP] += 1


def _is_float_mul(e: Expr) -> bool:
    return isinstance(e, Binary) and e.op == "*"


def _int_ops(index: Expr) -> int:
    match index:
        case Binary(_, a, b):
            return 1 + _int_ops(a) + _int_ops(b)
        case Unary(_, a) | Cast(_, a):
            return _int_ops(a)
        case _:
            return 0


def affine(expr: Expr, env: Env) -> Affine:
    """`expr` as coefficients of loop depths plus a constant (approximated: see the module)."""
    # isinstance rather than `match`: this runs for every index of every access, and the
    # class patterns cost twice as much here.
    if isinstance(expr, Var):
        return env.get(expr.name, _ZERO)
    if isinstance(expr, (IntImm, FloatImm)):
        return {}, float(expr.value)
    if isinstance(expr, Binary):
        return _affine_binary(expr, env)
    if isinstance(expr, Cast):
        return affine(expr.value, env)
    return _ZERO


def _affine_binary(expr: Binary, env: Env) -> Affine:
    op, a, b = expr.op, expr.a, expr.b
    if op == "+" or op == "-":
        return _combine(affine(a, env), affine(b, env), 1.0 if op == "+" else -1.0)
    if op == "*":
        return _product(affine(a, env), affine(b, env))
    if op == "floordiv" and type(b) is IntImm and b.value != 0:
        coefs, const = affine(a, env)
        return {d: k / b.value for d, k in coefs.items()}, const / b.value
    if op == "floormod" and type(b) is IntImm:
        return affine(a, env)[0], 0.0
    if op == "min" or op == "max":
        left = affine(a, env)
        return left if left[0] else affine(b, env)
    return _ZERO


def _combine(x: Affine, y: Affine, sign: float) -> Affine:
    if not y[0]:
        return x[0], x[1] + sign * y[1]
    coefs = dict(x[0])
    for d, k in y[0].items():
        coefs[d] = coefs.get(d, 0.0) + sign * k
    return coefs, x[1] + sign * y[1]


def _product(x: Affine, y: Affine) -> Affine:
    if not y[0]:
        return {d: k * y[1] for d, k in x[0].items()}, x[1] * y[1]
    if not x[0]:
        return {d: k * x[1] for d, k in y[0].items()}, x[1] * y[1]
    # A product of two moving indices is not affine: keep that both move.
    return _combine(x, y, 1.0)
