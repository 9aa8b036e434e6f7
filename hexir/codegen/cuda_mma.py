"""A tensorized warp nest (`hexir/schedule/tensorize.py`'s WarpMma) as CUDA C: each thread
loads its fragments of the two operand tiles and the warp runs one `mma.sync`.

    unsigned hx_a0[4], hx_b0[2];
    hx_ldsm_a(hx_a0, &A_shared[640 * mi], tx, 40);        // ldmatrix .x4, rows of 8 halves
    hx_ldsm_b_t(hx_b0, &B_shared[8 * nj], tx, 136);       // ldmatrix .x2 .trans
    hx_mma_f16(C_local[0], C_local[1], C_local[2], C_local[3], hx_a0, hx_b0);

A tile in shared memory whose k (for `a`; for `b` either axis) is contiguous, with rows of
16-byte-aligned starts, loads with `ldmatrix` (one instruction per fragment, 4 or 2 shared
wavefronts per warp); any other tile two 16-bit loads per fragment word. A fragment already
loaded by an earlier statement of the same straight-line run (an unrolled warp tile reads each
row of `a` for every column of `b`) is reused: the printer remembers what it loaded until a
scope opens or closes, a barrier or a store. The instruction needs sm_80; before it (and on
the CPU) the nest prints as loops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hexir.ir.arith import simplify
from hexir.ir.tir import Binary, BufferLoad, Expr, For, IntImm, Var
from hexir.schedule.tensorize import MmaMatch, WarpMma, match_mma

if TYPE_CHECKING:
    from hexir.codegen.cuda import CudaPrinter

MIN_ARCH = 80
LDSM_ALIGN = 8  # halves: ldmatrix reads 16-byte rows at 16-byte-aligned addresses

_HALVES = (
    "{q} unsigned hx_halves(const unsigned short* p, int stride) {{\n"
    "  return (unsigned)p[0] | ((unsigned)p[stride] << 16);\n}}"
)
# A fragment from anywhere, two halves a word. a: rows lane/4 (+8), k 2*(lane%4) (+1, +8, +9);
# b: k 2*(lane%4) (+1, +8, +9), column lane/4.
_FRAGMENTS = {
    "hx_frag_a": (
        "{q} void hx_frag_a(unsigned* f, const unsigned short* a, int lane, int rs, int ks) {{\n"
        "  const unsigned short* p = a + (lane >> 2) * rs + (lane & 3) * 2 * ks;\n"
        "  f[0] = hx_halves(p, ks); f[1] = hx_halves(p + 8 * rs, ks);\n"
        "  f[2] = hx_halves(p + 8 * ks, ks); f[3] = hx_halves(p + 8 * rs + 8 * ks, ks);\n}}"
    ),
    "hx_frag_b": (
        "{q} void hx_frag_b(unsigned* f, const unsigned short* b, int lane, int ks, int cs) {{\n"
        "  const unsigned short* p = b + (lane & 3) * 2 * ks + (lane >> 2) * cs;\n"
        "  f[0] = hx_halves(p, ks); f[1] = hx_halves(p + 8 * ks, ks);\n}}"
    ),
}
# ldmatrix: lane l gives the address of row l % 8 of 8x8 matrix l / 8 (.x2: lanes 0-15).
# helper -> (registers, .trans, the lane's row offset in the stored tile: C, and Python for
# the analyzer, gpu_analyze.py)
_LDSM = {
    # a stored [m][k]: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (8-15, 8-15)
    "hx_ldsm_a": (
        4, "", "((lane & 7) + (lane & 8)) * stride + (lane >> 4) * 8",
        lambda lane, stride: ((lane & 7) + (lane & 8)) * stride + (lane >> 4) * 8,
    ),
    # a stored [k][m], transposed by ldmatrix: the same four matrices, rows k
    "hx_ldsm_a_t": (
        4, ".trans", "((lane & 7) + (lane >> 4) * 8) * stride + (lane & 8)",
        lambda lane, stride: ((lane & 7) + (lane >> 4) * 8) * stride + (lane & 8),
    ),
    # b stored [n][k]: matrices (k 0-7), (k 8-15) of the 8 columns, rows n
    "hx_ldsm_b": (
        2, "", "(lane & 7) * stride + (lane & 8)",
        lambda lane, stride: (lane & 7) * stride + (lane & 8),
    ),
    # b stored [k][n], transposed: rows k
    "hx_ldsm_b_t": (
        2, ".trans", "((lane & 7) + (lane & 8)) * stride",
        lambda lane, stride: ((lane & 7) + (lane & 8)) * stride,
    ),
}  # fmt: skip
_MMA = (
    "{q} void hx_mma_{ptx}(float& c0, float& c1, float& c2, float& c3, const unsigned* a,\n"
    "    const unsigned* b) {{\n"
    '  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{ptx}.{ptx}.f32 {{%0, %1, %2, %3}}, "\n'
    '      "{{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"\n'
    '      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)\n'
    '      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));\n}}'
)


def _ldsm_helper(q: str, name: str) -> str:
    count, trans, row, _ = _LDSM[name]
    regs = ", ".join(f"%{i}" for i in range(count))
    outs = ", ".join(f'"=r"(f[{i}])' for i in range(count))
    return (
        f"{q} void {name}(unsigned* f, const unsigned short* tile, int lane, int stride) {{\n"
        f"  const unsigned short* row = tile + {row};\n"
        "  unsigned at = (unsigned)__cvta_generic_to_shared(row);\n"
        f'  asm volatile("ldmatrix.sync.aligned.m8n8.x{count}{trans}.shared.b16 {{{regs}}}, '
        f'[%{count}];"\n'
        f'      : {outs} : "r"(at));\n}}'
    )


def emit_mma(printer: CudaPrinter, loop: For, intrinsic: WarpMma, lane: Var | None) -> bool:
    """Print `loop`'s nest as fragment loads and one mma.sync; False (print it as loops)
    where the arch predates the instruction or the nest as lowered no longer matches."""
    arch = printer.target.arch if printer.target is not None else None
    if lane is None or not arch or int(arch.removeprefix("sm_")) < MIN_ARCH:
        return False
    found = match_mma(loop, intrinsic, printer.ranges, lane)
    if isinstance(found, str):
        return False
    if found.guard is None:
        _emit(printer, found, intrinsic, printer.var(lane))
    else:  # the fragments too: the condition may keep the tile's reads in bounds
        with printer.scope(f"if ({printer.bare(found.guard)}) {{"):
            _emit(printer, found, intrinsic, printer.var(lane))
    return True


def _emit(printer: CudaPrinter, found: MmaMatch, intrinsic: WarpMma, lane: str) -> None:
    a = _fragment(printer, found.a, found.a_strides, "a", lane)
    b = _fragment(printer, found.b, found.b_strides, "b", lane)
    name = f"hx_mma_{intrinsic.ptx}"
    printer.add_helper(name, _MMA.format(q=printer.helper_qualifier, ptx=intrinsic.ptx))
    acc = ", ".join(printer.access(c.buffer, c.indices) for c in found.acc)
    printer.emit(f"{name}({acc}, {a}, {b});")


def _fragment(
    printer: CudaPrinter, tile: BufferLoad, strides: tuple[int, int], which: str, lane: str
) -> str:
    """The name of a register array holding this thread's fragment of `tile` (its origin,
    `strides` (row, k) for a, (k, column) for b), loaded here unless already loaded."""
    pointer = f"&{printer.access(tile.buffer, tile.indices)}"
    known = printer.fragments.get((which, pointer))
    if known is not None:
        return known
    name = f"hx_{which}{len(printer.fragments)}"
    printer.emit(f"unsigned {name}[{4 if which == 'a' else 2}];")
    ldsm = ldsm_kind(tile, strides, which, printer.flat(tile.buffer, tile.indices), printer.ranges)
    if ldsm is not None:
        helper, stride = ldsm
        printer.add_helper(helper, _ldsm_helper(printer.helper_qualifier, helper))
        printer.emit(f"{helper}({name}, {pointer}, {lane}, {stride});")
    else:
        helper = f"hx_frag_{which}"
        printer.add_helper("hx_halves", _HALVES.format(q=printer.helper_qualifier))
        printer.add_helper(helper, _FRAGMENTS[helper].format(q=printer.helper_qualifier))
        printer.emit(f"{helper}({name}, {pointer}, {lane}, {strides[0]}, {strides[1]});")
    printer.fragments[(which, pointer)] = name
    return name


def ldsm_kind(
    tile: BufferLoad, strides: tuple[int, int], which: str, offset: Expr, ranges: dict[Var, int]
) -> tuple[str, int] | None:
    """(the ldmatrix helper, the stored tile's row stride) where `tile` (operand `which`, its
    origin at flat `offset`) is in shared memory with one axis contiguous and every row's
    start 16-byte aligned; None elsewhere."""
    if tile.buffer.scope != "shared":
        return None
    first, second = strides  # a: (row, k); b: (k, column)
    if which == "a":
        helper, stride = ("hx_ldsm_a", first) if second == 1 else ("hx_ldsm_a_t", second)
    else:
        helper, stride = ("hx_ldsm_b", second) if first == 1 else ("hx_ldsm_b_t", first)
    if 1 not in strides or stride % LDSM_ALIGN:
        return None
    rest = simplify(Binary("floormod", offset, IntImm(LDSM_ALIGN, offset.dtype)), ranges)
    return (helper, stride) if rest == IntImm(0, offset.dtype) else None


def ldsm_rows(helper: str, stride: int) -> list[list[int]]:
    """The element offsets of the rows an ldmatrix helper reads, matrix by matrix (8 each)."""
    count, _, _, row = _LDSM[helper]
    return [[row(lane, stride) for lane in range(8 * g, 8 * g + 8)] for g in range(count)]


def mma_lane(axes: dict[str, tuple[Var, int]]) -> Var | None:
    """The lane var where threadIdx.x is bound around the nest with a warp's 32 threads."""
    bound = axes.get("threadIdx.x")
    return bound[0] if bound is not None and bound[1] == 32 else None


__all__ = ["emit_mma", "ldsm_kind", "ldsm_rows", "mma_lane"]
