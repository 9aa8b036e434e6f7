"""The structural match of a tile intrinsic (x86's AMX, `TileIntrinsic` in
hexir/schedule/tensorize.py): whether a loop nest computes rows x panels of a matmul over a
whole reduction, and where its tiles start and how far apart their rows lie.

    found = match_tile(loop, AMX_BF16, loop_ranges(func))
    found.rows, found.panels, found.depth     # an Expr (R or a guard's bound), P, D / 16
    found.strides                             # of c's rows and panels, a's rows, b's steps
                                              # and panels, in elements

The nest's accesses are read as affine functions of its loops (their coefficients), so any
buffer shapes and offsets match, and any strides a tile load can take: each row of a tile is
64 contiguous bytes, the rows any distance apart. A condition that cuts the rows (a ragged
last row tile's `i0*32 + i < M`) becomes the rows count at run time; any other condition must
be free of the nest's loops.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexir.ir.arith import affine_coefficients, flat_index, simplify
from hexir.ir.tir import Binary, BufferLoad, BufferStore, Expr, For, IntImm, Stmt, Var
from hexir.ir.visit import free_vars, substitute
from hexir.schedule.common import conjoin
from hexir.schedule.tensorize import (
    MAX_TILE_PANELS,
    MAX_TILE_ROWS,
    TILE_DEPTH,
    TILE_LANES,
    TileIntrinsic,
    accumulated_product,
    indices_at,
    single_statement,
)

ROLES = ("rows", "panels", "lanes", "steps", "group")  # the nest's loops, outermost first


@dataclass(frozen=True)
class TileMatch:
    """A nest that computes a TileIntrinsic: its operands where i = p = j = kk = k = 0, the
    strides (in elements) `c_row`, `c_panel`, `a_row`, `b_step`, `b_panel`, and the extents."""

    acc: BufferLoad
    a: BufferLoad  # the operand read along the rows (a tile of rows x 64 bytes per step)
    b: BufferLoad  # the one read along the panels (a tile of 16 steps x 64 bytes)
    strides: dict[str, int]
    rows: Expr  # the rows computed: the rows loop's extent, or fewer under a guard
    panels: int
    depth: int  # tile steps: the reduction's groups / 16
    guard: Expr | None  # where the nest runs at all, free of its loops


def match_tile(loop: For, intrinsic: TileIntrinsic, ranges: dict[Var, int]) -> TileMatch | str:
    """The match of `loop`'s nest against `intrinsic`, or why it does not match."""
    guards: list[Expr] = []
    nest = _nest(loop, guards)
    if isinstance(nest, str):
        return nest
    loops, store = nest
    scope = {**ranges, **{f.var: f.extent for f in loops}}
    operands = accumulated_product(store, scope, intrinsic.acc)
    if isinstance(operands, str):
        return operands
    if {x.dtype for x in operands} != intrinsic.operands:  # one of each, or both the one
        want = " and ".join(sorted(intrinsic.operands))
        return f"the operands are {operands[0].dtype} and {operands[1].dtype}, not {want}"
    extents = dict(zip(ROLES, (f.extent for f in loops), strict=True))
    reason = _extents(extents, intrinsic)
    if reason:
        return reason
    order = [f.var for f in loops]
    coeffs = []
    for access in (store, *operands):
        found = affine_coefficients(flat_index(access.buffer, access.indices), order, scope)
        if found is None:
            return f"{access.buffer.name}'s index is not affine in the nest's loops"
        coeffs.append(dict(zip(ROLES, (found[v] for v in order), strict=True)))
    c, x, y = coeffs
    a, b = (operands, (x, y)) if _rows_operand(x, intrinsic) else (operands[::-1], (y, x))
    strides = _strides(c, *b, intrinsic)
    if isinstance(strides, str):
        return strides
    rows, outer = _rows(guards, loops, scope)
    if isinstance(rows, str):
        return rows
    at_zero = {v: IntImm(0, v.dtype) for v in order}
    load = [BufferLoad(x.buffer, indices_at(x.indices, at_zero, scope)) for x in (store, *a)]
    return TileMatch(
        *load,
        strides,
        rows,
        extents["panels"],
        extents["steps"] // TILE_DEPTH,
        conjoin(outer) if outer else None,
    )


def _nest(loop: For, guards: list[Expr]) -> tuple[list[For], BufferStore] | str:
    """The nest's five loops (a panel loop of 1 added where there are four) and its store."""
    loops: list[For] = []
    node: Stmt | None = loop
    while isinstance(node, For) and len(loops) < len(ROLES):
        loops.append(node)
        node = single_statement(node.body, guards)
    if len(loops) == len(ROLES) - 1 and not isinstance(node, For):
        unit = Var(f"{loop.var.name}_panel", loop.var.dtype)
        loops.insert(1, For(unit, 1, "serial", loops[1]))
    if len(loops) != len(ROLES) or not isinstance(node, BufferStore):
        return "the nest is not rows, (panels,) lanes, steps and group loops around one store"
    return loops, node


def _extents(extents: dict[str, int], intrinsic: TileIntrinsic) -> str | None:
    if extents["rows"] > MAX_TILE_ROWS or extents["panels"] > MAX_TILE_PANELS:
        return (
            f"{extents['rows']} rows x {extents['panels']} panels: at most {MAX_TILE_ROWS} "
            f"x {MAX_TILE_PANELS}"
        )
    if extents["lanes"] != TILE_LANES or extents["group"] != intrinsic.group:
        return (
            f"the lanes and group loops have {extents['lanes']} and {extents['group']} "
            f"iterations, the intrinsic {TILE_LANES} and {intrinsic.group}"
        )
    if extents["steps"] % TILE_DEPTH:
        return f"the steps loop has {extents['steps']} iterations, not a multiple of {TILE_DEPTH}"
    return None


def _rows_operand(coeffs: dict[str, int], intrinsic: TileIntrinsic) -> bool:
    """Whether an operand with these coefficients is read as a[i, kk*group + k]."""
    return (coeffs["panels"], coeffs["lanes"], coeffs["steps"], coeffs["group"]) == (
        0,
        0,
        intrinsic.group,
        1,
    )


def _strides(
    c: dict[str, int], a: dict[str, int], b: dict[str, int], intrinsic: TileIntrinsic
) -> dict[str, int] | str:
    """The tiles' row strides, or why the accesses are not the intrinsic's."""
    if (c["lanes"], c["steps"], c["group"]) != (1, 0, 0):
        return "the accumulator is not contiguous along the lanes and the same for every step"
    if not _rows_operand(a, intrinsic):
        return f"no operand is read as a[i, kk*{intrinsic.group} + k]"
    if (b["rows"], b["lanes"], b["group"]) != (0, intrinsic.group, 1):
        return f"the other operand is not read as b[p, kk, j, k], 16 x {intrinsic.group} contiguous"
    return {
        "c_row": c["rows"],
        "c_panel": c["panels"],
        "a_row": a["rows"],
        "b_step": b["steps"],
        "b_panel": b["panels"],
    }


def _rows(
    guards: list[Expr], loops: list[For], scope: dict[Var, int]
) -> tuple[Expr | str, list[Expr]]:
    """The rows the nest computes (the rows loop's extent, or fewer under a guard `e(i) <
    bound` whose i has coefficient 1) and the guards free of the nest's loops; a message
    where a guard is neither."""
    i, inner = loops[0].var, {f.var for f in loops[1:]}
    count: Expr = IntImm(loops[0].extent, i.dtype)
    outer: list[Expr] = []
    for guard in guards:
        used = free_vars(guard) & (inner | {i})
        if not used:
            outer.append(guard)
            continue
        bound = _row_bound(guard, i, scope) if used == {i} else None
        if bound is None:
            return "a condition inside the nest depends on its loops, not as i < bound", []
        count = Binary("min", count, bound)
    return simplify(count, scope), outer


def _row_bound(guard: Expr, i: Var, scope: dict[Var, int]) -> Expr | None:
    """n - e(0) of a guard e(i) < n with e's coefficient of i 1 (None for any other guard)."""
    if not isinstance(guard, Binary) or guard.op != "<":
        return None
    apart = Binary("-", guard.b, guard.a)
    coeffs = affine_coefficients(apart, [i], scope)
    if coeffs is None or coeffs[i] != -1:
        return None
    return simplify(substitute(apart, {i: IntImm(0, i.dtype)}), scope)
