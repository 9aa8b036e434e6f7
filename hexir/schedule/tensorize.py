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

A tile intrinsic (`TileIntrinsic`: x86's AMX, `tdpbf16ps` and `tdpbusd`/`tdpbsud`) describes
a larger nest, up to 32 rows x 2 panels of 16 accumulators over a whole reduction, which its
C helper holds in tile registers throughout (matched in `hexir/schedule/tensorize_tile.py`,
printed by `hexir/codegen/c_amx.py`).

The match reads the flattened indices of the accumulator and both operands as affine
functions of j and k (their strides), so any loop order outside the two loops, any buffer
shapes and any offsets match. The C printer (`hexir/codegen/c.py`) emits the instruction where
the compiler targets it (`__AVX512VNNI__`, `__AVX512BF16__`) and the nest as it is elsewhere:
the nest is the semantics either way.

A warp's tensor-core instruction (`WarpMma`, CUDA's `mma.sync.aligned.m16n8k16`, sm_80 and
later) is described by what one thread of the warp computes, lane = threadIdx.x (32 threads):

    for ri in 0..2:              # the thread's rows lane/4 and lane/4 + 8 of the 16
      for cj in 0..2:            # its columns 2*(lane%4) and 2*(lane%4) + 1 of the 8
        for k in 0..16:
          c[ri, cj] = c[ri, cj] + float32(a[lane/4 + 8*ri, k]) * float32(b[k, 2*(lane%4) + cj])

a a 16x16 tile and b a 16x8 tile of float16 (or bfloat16) at any strides, c four float32s
the thread owns. That is the instruction's result layout: the 32 threads' nests together are
the warp's 16x8x16 product, which the instruction computes from fragments the threads load
(`ldmatrix` where the tile is in shared memory with 16-byte rows, else two halves a word;
`hexir/codegen/cuda.py`). Every thread of the warp must reach the nest: a condition around it
may not depend on the lane. On the CPU, and on a GPU before sm_80, the nest runs as loops.
"""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class WarpMma:
    """A warp's m16n8k16 multiply-accumulate into float32 on tensor cores (module docstring)."""

    name: str
    operand: str  # both operands' dtype
    ptx: str  # its PTX type
    description: str


def _mma(operand: str, ptx: str) -> WarpMma:
    return WarpMma(
        f"cuda_mma_m16n8k16_{ptx}",
        operand,
        ptx,
        "per thread, lane = threadIdx.x of 32: for ri in 0..2: for cj in 0..2: for k in 0..16: "
        f"c[ri, cj] += float32(a[lane/4 + 8*ri, k]) * float32(b[k, 2*(lane%4) + cj]) (a, b "
        f"{operand}, c float32 and k-invariant): mma.sync.aligned.m16n8k16 (sm_80+)",
    )


@dataclass(frozen=True)
class TileIntrinsic:
    """A tile multiply-accumulate (x86's AMX), described as the nest it computes:

        for i in 0..R:              # rows, R <= 32: one or two tiles of 16 (a condition
          for p in 0..P:            #   i < bound may leave the last ones out)
            for j in 0..16:         # panels, P <= 2, of 16 accumulators each
              for kk in 0..D:       # D a multiple of 16: steps of one tile's depth
                for k in 0..group:
                  c[i, p, j] += acc(a[i, kk*group + k]) * acc(b[p, kk, j, k])

    at any strides of c's rows and panels, a's rows and b's steps and panels (the panel loop
    may be left out: P = 1). b is a weight in the dot intrinsic's groups (16 columns of
    `group` products a 64-byte row, hexir/graph/layout.py), which is a tile's row layout."""

    name: str
    group: int  # products summed into each accumulator per row of b
    acc: str
    operands: frozenset[str]
    description: str


def _amx(
    name: str, group: int, acc: str, operands: frozenset[str], instruction: str
) -> TileIntrinsic:
    return TileIntrinsic(
        name,
        group,
        acc,
        operands,
        f"for i in 0..R (R <= 32): for p in 0..P (P <= 2): for j in 0..16: for kk in 0..D (D a "
        f"multiple of 16): for k in 0..{group}: c[i, p, j] += {acc}(a[i, kk*{group} + k]) * "
        f"{acc}(b[p, kk, j, k]) (c {acc}; a and b {' and '.join(sorted(operands))}): "
        f"{instruction}",
    )


AMX_BF16 = _amx("x86_amx_bf16_f32", 2, "float32", frozenset({"bfloat16"}), "AMX tdpbf16ps")
AMX_INT8 = _amx("x86_amx_u8s8", 4, "int32", frozenset(BYTE_INTS), "AMX tdpbusd/tdpbsud")
TILE_LANES, TILE_ROWS, TILE_DEPTH = 16, 16, 16  # a tile: 16 rows of 64 bytes
MAX_TILE_ROWS, MAX_TILE_PANELS = 2 * TILE_ROWS, 2  # 4 accumulator tiles, 2 of a, 2 of b: 8


def tile_intrinsic(a: str, b: str) -> TileIntrinsic | None:
    """The tile intrinsic of operands of dtypes `a` and `b` (None: none)."""
    return next((i for i in (AMX_INT8, AMX_BF16) if {a, b} == i.operands), None)


MMA_F16 = _mma("float16", "f16")
MMA_BF16 = _mma("bfloat16", "bf16")
MMA_ROWS, MMA_COLS, MMA_DEPTH = 16, 8, 16
WARP = 32
INTRINSICS: dict[str, Intrinsic | TileIntrinsic | WarpMma] = {
    i.name: i for i in (VNNI_DOT, BF16_DOT, AMX_BF16, AMX_INT8, MMA_F16, MMA_BF16)
}
# The intrinsic whose products a contraction of these operand dtypes makes, by dtype pair.
DOT_INTRINSICS = (VNNI_DOT, BF16_DOT)


def dot_intrinsic(a: str, b: str) -> Intrinsic | None:
    """The dot-product intrinsic of operands of dtypes `a` and `b` (None: none)."""
    return next((i for i in DOT_INTRINSICS if {a, b} == i.operands), None)


def mma_intrinsic(a: str, b: str) -> WarpMma | None:
    """The tensor-core intrinsic of operands of dtypes `a` and `b` (None: none)."""
    return next((i for i in (MMA_F16, MMA_BF16) if a == b == i.operand), None)


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
    inner = single_statement(loop.body, guards)
    if not isinstance(inner, For) or inner.extent != intrinsic.group:
        return f"the loop's body is not one loop of {intrinsic.group} iterations"
    store = single_statement(inner.body, guards)
    if not isinstance(store, BufferStore):
        return "the inner loop's body is not one store"
    j, k = loop.var, inner.var
    if any(free_vars(g) & {j, k} for g in guards):
        return "a condition inside the nest depends on its loops"
    scope = {**ranges, j: loop.extent, k: inner.extent}
    operands = accumulated_product(store, scope, intrinsic.acc)
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
        indices_at(store.indices, at_zero, scope),
        BufferLoad(broadcast.buffer, indices_at(broadcast.indices, at_zero, scope)),
        BufferLoad(wide.buffer, indices_at(wide.indices, at_zero, scope)),
        conjoin(guards) if guards else None,
    )


def single_statement(stmt: Stmt, guards: list[Expr]) -> Stmt | None:
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


def accumulated_product(
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


def indices_at(indices: tuple[Expr, ...], values: dict[Var, Expr], scope: dict[Var, int]) -> tuple:
    return tuple(simplify(substitute(i, values), scope) for i in indices)


@dataclass(frozen=True)
class MmaMatch:
    """A nest that computes a WarpMma: the thread's four accumulators (c0..c3: rows lane/4
    and lane/4 + 8, columns 2*(lane%4) + 0 and 1), and each operand tile's origin (lane 0's
    first element) with its strides in elements, (row, k) for `a` and (k, column) for `b`."""

    acc: tuple[BufferLoad, BufferLoad, BufferLoad, BufferLoad]
    a: BufferLoad
    a_strides: tuple[int, int]
    b: BufferLoad
    b_strides: tuple[int, int]
    guard: Expr | None  # where the warp runs the nest at all, free of the lane


def match_mma(loop: For, intrinsic: WarpMma, ranges: dict[Var, int], lane: Var) -> MmaMatch | str:
    """The match of `loop`'s nest, in the scope of the lane var `lane` (threadIdx.x, 32
    threads), against `intrinsic`, or why it does not match."""
    if ranges.get(lane) != WARP:
        return f"the lane (threadIdx.x) has {ranges.get(lane)} threads, not a warp's {WARP}"
    guards: list[Expr] = []
    nest = _mma_nest(loop, guards)
    if isinstance(nest, str):
        return nest
    store, (ri, cj, k) = nest
    if any(free_vars(g) & {ri, cj, k, lane} for g in guards):
        return "a condition inside or around the nest depends on the lane or the nest's loops"
    # The lane as its row (lane / 4) and column pair (lane % 4): the indices become affine.
    q, r = Var("lane/4", lane.dtype), Var("lane%4", lane.dtype)
    split = {lane: q * IntImm(4, lane.dtype) + r}
    scope = {v: e for v, e in ranges.items() if v != lane} | {q: 8, r: 4, ri: 2, cj: 2, k: 16}
    lanes = substitute(store, split)
    operands = accumulated_product(lanes, scope, "float32")  # type: ignore[arg-type]
    if isinstance(operands, str):
        return operands
    if any(x.dtype != intrinsic.operand for x in operands):
        return (
            f"the operands are {operands[0].dtype} and {operands[1].dtype}, not {intrinsic.operand}"
        )
    order = [q, r, ri, cj, k]
    coeffs = _coefficients((lanes, *operands), order, scope)  # type: ignore[arg-type]
    if isinstance(coeffs, str):
        return coeffs
    reason = _mma_accumulator(store.buffer, coeffs[0])
    if reason:
        return reason
    at_zero = {v: IntImm(0, v.dtype) for v in order}
    for a, b, ca, cb in ((*operands, *coeffs[1:]), (*operands[::-1], *coeffs[:0:-1])):
        if _mma_a(ca) and _mma_b(cb):
            here = [BufferLoad(x.buffer, indices_at(x.indices, at_zero, scope)) for x in (a, b)]
            corners = [{ri: IntImm(i // 2), cj: IntImm(i % 2)} for i in range(4)]
            acc = [BufferLoad(store.buffer, indices_at(store.indices, c, ranges)) for c in corners]
            guard = conjoin(guards) if guards else None
            return MmaMatch(tuple(acc), here[0], (ca[0], ca[4]), here[1], (cb[4], cb[3]), guard)  # type: ignore[arg-type]
    return (
        "the operands are not a[lane/4 + 8*ri, k] and b[k, 2*(lane%4) + cj] at any strides "
        f"(coefficients of lane/4, lane%4, ri, cj, k: {coeffs[1]} and {coeffs[2]})"
    )


def _mma_nest(loop: For, guards: list[Expr]) -> tuple[BufferStore, tuple[Var, ...]] | str:
    """The one store inside `loop`'s three loops of 2, 2 and 16 iterations, and their vars
    (conditions on the way to `guards`), or why the nest is not that."""
    nest: list[Stmt | None] = [loop]
    for extent in (2, 2, MMA_DEPTH):
        node = nest[-1]
        if not isinstance(node, For) or node.extent != extent:
            return "the nest is not three loops of 2, 2 and 16 iterations"
        nest.append(single_statement(node.body, guards))
    store = nest[-1]
    if not isinstance(store, BufferStore):
        return "the innermost loop's body is not one store"
    return store, tuple(f.var for f in nest[:3])  # type: ignore[union-attr]


def _coefficients(
    accesses: tuple[BufferLoad | BufferStore, ...], order: list[Var], scope: dict[Var, int]
) -> list[tuple[int, ...]] | str:
    """Each access's flat index as coefficients of `order`, or why one is not affine."""
    coeffs = []
    for access in accesses:
        found = affine_coefficients(flat_index(access.buffer, access.indices), order, scope)
        if found is None:
            return f"{access.buffer.name}'s index is not affine in the lane and the nest's loops"
        coeffs.append(tuple(found[v] for v in order))
    return coeffs


def _mma_accumulator(buffer: Buffer, c: tuple[int, ...]) -> str | None:
    """Why the accumulator with coefficients `c` (of lane/4, lane%4, ri, cj, k) is not four
    elements per thread, the same for every k, apart from other threads' unless per thread."""
    cq, cr, cri, ccj, ck = c
    if ck:
        return "the accumulator changes with k"
    if len({cri * i + ccj * j for i in range(2) for j in range(2)}) < 4:
        return "the accumulator is not four elements per thread"
    if buffer.scope == "local":
        return None
    points = itertools.product(range(8), range(4), range(2), range(2))
    mine = {cq * x + cr * y + cri * i + ccj * j for x, y, i, j in points}
    return None if len(mine) == 128 else "two threads of the warp accumulate into one element"


def _mma_a(c: tuple[int, ...]) -> bool:  # a[lane/4 + 8*ri, k]: rows at any stride, k
    cq, cr, cri, ccj, ck = c
    return cq != 0 and cri == 8 * cq and cr == ccj == 0 and ck != 0


def _mma_b(c: tuple[int, ...]) -> bool:  # b[k, 2*(lane%4) + cj]
    cq, cr, cri, ccj, ck = c
    return ccj != 0 and cr == 2 * ccj and cq == cri == 0 and ck != 0
