"""Intrinsics `sch.tensorize` can put in place of a loop nest, and the structural match that
decides whether a nest computes what the intrinsic computes.

An intrinsic describes a nest of two loops, `lanes` outer and `group` inner, around one
multiply-accumulate of widened narrow operands:

    for j in 0..16:              # lanes: one accumulator per j, contiguous
      for k in 0..4:             # group: 4 products summed into each accumulator
        c[j] = c[j] + int32(a[k]) * int32(b[j*4 + k])

with `a` read at `group` consecutive elements whatever j (one 32-bit broadcast) and `b` at
lanes x group consecutive ones (j*group + k):

- `x86_vnni_dot_u8s8`: 4 products of a uint8 and an int8 into int32 (one operand of each),
  x86's VNNI instruction `vpdpbusd` (`_mm512_dpbusd_epi32`);
- `x86_bf16_dot_f32`: 2 products of bfloat16s into float32, AVX512_BF16's `vdpbf16ps`
  (`_mm512_dpbf16_ps`; it adds the two products in turn, the second first, treats denormal
  inputs as zeros and rounds each addition to the nearest float32: within float32 rounding of
  the nest's order).

The match reads the flattened indices of the accumulator and both operands as affine
functions of j and k (their strides), so any loop order outside the two loops, any buffer
shapes and any offsets match. The C printer (`hexir/codegen/c.py`) emits the instruction where
the compiler targets it (`__AVX512VNNI__`, `__AVX512BF16__`) and the nest as it is elsewhere:
the nest is the semantics either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexir.ir.arith import affine_coefficients, flat_index, simplify
from hexir.ir.dtype import BYTE_INTS
from hexir.ir.tir import (
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Cast,
    Expr,
    For,
    IfThenElse,
    IntImm,
    Seq,
    Stmt,
    Var,
)
from hexir.ir.visit import free_vars, substitute
from hexir.schedule.common import conjoin

TENSORIZE = "tensorize"  # the loop annotation: the intrinsic's name


@dataclass(frozen=True)
class Intrinsic:
    name: str
    lanes: int  # the outer loop: one accumulator each, contiguous
    group: int  # the inner loop: products summed into each accumulator
    acc: str  # the accumulator's dtype
    operands: frozenset[str]  # the operands' dtypes (one of each, or both the one)
    description: str


VNNI_DOT = Intrinsic(
    "x86_vnni_dot_u8s8",
    16,
    4,
    "int32",
    frozenset(BYTE_INTS),
    "for j in 0..16: for k in 0..4: c[j] += int32(a[k]) * int32(b[j*4 + k]) (c int32, "
    "contiguous in j; a and b 8-bit, one unsigned and one signed; a contiguous in k and "
    "the same for every j, b contiguous in (j, k)): vpdpbusd",
)
BF16_DOT = Intrinsic(
    "x86_bf16_dot_f32",
    16,
    2,
    "float32",
    frozenset({"bfloat16"}),
    "for j in 0..16: for k in 0..2: c[j] += float32(a[k]) * float32(b[j*2 + k]) (c float32, "
    "contiguous in j; a and b bfloat16; a contiguous in k and the same for every j, b "
    "contiguous in (j, k)): vdpbf16ps",
)
INTRINSICS = {i.name: i for i in (VNNI_DOT, BF16_DOT)}
# The intrinsic whose products a contraction of these operand dtypes makes, by dtype pair.
DOT_INTRINSICS = (VNNI_DOT, BF16_DOT)


def dot_intrinsic(a: str, b: str) -> Intrinsic | None:
    """The dot-product intrinsic of operands of dtypes `a` and `b` (None: none)."""
    return next((i for i in DOT_INTRINSICS if {a, b} == i.operands), None)


@dataclass(frozen=True)
class DotMatch:
    """A nest that computes a dot intrinsic: where its accumulator and operands start (j = k
    = 0)."""

    acc: Buffer
    acc_index: tuple[Expr, ...]
    broadcast: BufferLoad  # the operand read once for every j (`group` elements)
    wide: BufferLoad  # the other (lanes x group elements)
    guard: Expr | None  # where the nest runs at all (a ragged row tile's), free of j and k


def match_dot(loop: For, intrinsic: Intrinsic, ranges: dict[Var, int]) -> DotMatch | str:
    """The match of `loop`'s nest against `intrinsic`, or why it does not match."""
    if loop.extent != intrinsic.lanes:
        return f"the loop has {loop.extent} iterations, the intrinsic {intrinsic.lanes}"
    guards: list[Expr] = []
    inner = _only(loop.body, guards)
    if not isinstance(inner, For) or inner.extent != intrinsic.group:
        return f"the loop's body is not one loop of {intrinsic.group} iterations"
    store = _only(inner.body, guards)
    if not isinstance(store, BufferStore):
        return "the inner loop's body is not one store"
    j, k = loop.var, inner.var
    if any(free_vars(g) & {j, k} for g in guards):
        return "a condition inside the nest depends on its loops"
    scope = {**ranges, j: loop.extent, k: inner.extent}
    operands = _accumulated_product(store, scope, intrinsic.acc)
    if isinstance(operands, str):
        return operands
    a, b = operands
    if dot_intrinsic(a.dtype, b.dtype) != intrinsic:
        names = sorted(intrinsic.operands)
        want = f"both {names[0]}" if len(names) == 1 else f"one {names[0]} and one {names[1]}"
        return f"the operands are {a.dtype} and {b.dtype}, not {want}"
    strides: list[tuple[int, int]] = []  # (along the outer loop, along the inner) of each
    for what, access in (("the accumulator", store), ("an operand", a), ("an operand", b)):
        coeffs = affine_coefficients(flat_index(access.buffer, access.indices), [j, k], scope)
        if coeffs is None:
            return f"{what} {access.buffer.name} is not affine in the two loops"
        strides.append((coeffs[j], coeffs[k]))
    acc_strides, a_strides, b_strides = strides
    if acc_strides != (1, 0):
        return "the accumulator is not contiguous along the outer loop alone"
    if {a_strides, b_strides} != {(0, 1), (intrinsic.group, 1)}:
        return (
            "the operands are not one read contiguously along the inner loop alone and one "
            f"contiguous in (outer, inner) (strides {sorted({a_strides, b_strides})})"
        )
    at_zero = {j: IntImm(0, j.dtype), k: IntImm(0, k.dtype)}
    broadcast, wide = (a, b) if a_strides == (0, 1) else (b, a)
    return DotMatch(
        store.buffer,
        _at(store.indices, at_zero, scope),
        BufferLoad(broadcast.buffer, _at(broadcast.indices, at_zero, scope)),
        BufferLoad(wide.buffer, _at(wide.indices, at_zero, scope)),
        conjoin(guards) if guards else None,
    )


def _only(stmt: Stmt, guards: list[Expr]) -> Stmt | None:
    """The one statement a loop body holds, through one-element Seqs, blocks (their iter vars
    replaced by their bindings) and conditions without an else, which go to `guards`; a
    block with an init is not one statement."""
    while True:
        match stmt:
            case Block(init=None) as block:
                bindings = {iv.var: iv.binding for iv in block.iter_vars}
                if block.predicate is not None:
                    guards.append(substitute(block.predicate, bindings))
                stmt = substitute(block.body, bindings)
            case Block():
                return None
            case IfThenElse(cond, then, None):
                guards.append(cond)
                stmt = then
            case Seq(stmts=(single,)):
                stmt = single
            case _:
                return stmt


def _accumulated_product(
    store: BufferStore, scope: dict[Var, int], dtype: str
) -> tuple[BufferLoad, BufferLoad] | str:
    """The two loads of `c = c + dtype(x) * dtype(y)` (`dtype` the accumulator's), or why the
    store is not that."""
    if store.buffer.dtype != dtype:
        return f"the accumulator is {store.buffer.dtype}, not {dtype}"
    match store.value:
        case Binary("+", BufferLoad() as acc, product) if _same(acc, store, scope):
            pass
        case Binary("+", product, BufferLoad() as acc) if _same(acc, store, scope):
            pass
        case _:
            return "the store is not an accumulation c = c + ..."
    match product:
        case Binary("*", Cast(tx, BufferLoad() as x), Cast(ty, BufferLoad() as y)) if (
            tx == ty == dtype
        ):
            return x, y
    return "the accumulated value is not the product of two widened loads"


def _same(load: BufferLoad, store: BufferStore, scope: dict[Var, int]) -> bool:
    """Whether `load` reads the element `store` writes (the indices as written may differ)."""
    if load.buffer != store.buffer:
        return False
    apart = Binary(
        "-", flat_index(load.buffer, load.indices), flat_index(store.buffer, store.indices)
    )
    return simplify(apart, scope) == IntImm(0)


def _at(indices: tuple[Expr, ...], values: dict[Var, Expr], scope: dict[Var, int]) -> tuple:
    return tuple(simplify(substitute(i, values), scope) for i in indices)
