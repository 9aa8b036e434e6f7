"""C for any hextir PrimFunc: one C-like printer whose per-target data a CUDA printer overrides.

    source = generate_c(func, target)   # a translation unit exporting `kernel_symbol(func)`

Semantics of the loop kinds on the CPU: `parallel` is an OpenMP `parallel for` (the outermost
one only; nested ones run serially); `vectorized` is explicit SIMD through GCC vector
extensions, the target's width (c_vector.py), or an `omp simd` loop where the body has no
vector form; `unrolled` is unrolled in the source (c_lower.py), or a `GCC unroll` loop when too
large; GPU kinds (blockIdx.*, threadIdx.*, vthread) are plain serial loops, so that any GPU
schedule's values can be checked on a CPU (DESIGN.md §3). A `local` buffer read and written
only at constant indices (after unrolling), its last axis by whole vector chunks, is an array
of vectors that GCC keeps in registers: the accumulator tile of a matmul schedule.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hexir.codegen.c_amx import tile_arguments, tile_helpers
from hexir.codegen.c_inplace import in_place_candidates
from hexir.codegen.c_lower import (
    AUTO_UNROLL_MAX_NODES,
    SourceTooLong,
    loop_lanes,
    lower_for_c,
    nodes,
    register_buffers,
    unroll_factor,
)
from hexir.codegen.c_math import MATH_NEEDS, math_helper
from hexir.codegen.c_names import BIT_OPERATORS, C_KEYWORDS, LIBRARY_NAMES, Names, kernel_symbol
from hexir.codegen.c_narrow import (
    float4_helpers,
    float8_helpers,
    sub_byte_helpers,
    sub_byte_value,
)
from hexir.codegen.c_prefetch import LINE, PREFETCH, Prefetch
from hexir.codegen.c_prefetch import plan as prefetch_plan
from hexir.codegen.c_vector import (
    HELPER_NEEDS,
    HORIZONTAL,
    INTRINSIC_HELPER,
    VECTOR_HELPERS,
    BodyPrinter,
    bfloat16_helper,
    emit_lane_reduction,
    emit_vector_loop,
    horizontal_helper,
    reduces_across,
    widen_bytes_helper,
    x86_intrinsic,
)
from hexir.errors import BuildError
from hexir.ir.arith import bound, flat_index, simplify
from hexir.ir.dtype import (
    SUB_BYTE_INTS,
    c_type,
    is_float,
    is_int,
    is_unsigned,
    itemsize,
    numpy_dtype,
    short_name,
)
from hexir.ir.symbolic import Dim, Sym
from hexir.ir.tir import (
    AUTO_UNROLL_KEY,
    GPU_KINDS,
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
    StmtBase,
    Unary,
    Var,
    dim_expr,
    symbol_var,
)
from hexir.ir.visit import children
from hexir.schedule.common import all_loops
from hexir.schedule.tensorize import (
    INTRINSICS,
    TENSORIZE,
    DotMatch,
    Intrinsic,
    TileIntrinsic,
    match_dot,
)
from hexir.schedule.tensorize_tile import TileMatch, match_tile

if TYPE_CHECKING:  # codegen sits below runtime (STYLE.md): the type only
    from hexir.runtime.target import Target

# Math calls by their double-precision C name; the float32 one adds an `f`.
_MATH = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "erf": "erf",
    "abs": "fabs",
    "floor": "floor",
    "ceil": "ceil",
    "round": "nearbyint",  # ties to even in the default rounding mode
    "sin": "sin",
    "cos": "cos",
}
# Conversions c_narrow.py leaves between float32 and a 16-bit float, by `<from>_<to>` of the
# dtypes' short names; {q} is the helper qualifier, {u16} and {u32} the unsigned C types.
# bfloat16's bits from a float (to the nearest, ties to even; a NaN stays a quiet NaN) and
# back, through a union: C allows the type pun, CUDA C compiles it to a move. (float16 is
# _Float16 in C, converted by C casts; CUDA C adds its own, cuda.py.)
BF16_HELPERS = {
    "f32_bf16": (
        "{q} {u16} hx_f32_bf16(float x) {{\n"
        "  union {{ float f; {u32} u; }} v; v.f = x;\n"
        "  if (x != x) return ({u16})((v.u >> 16) | 0x40);\n"
        "  return ({u16})((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);\n}}"
    ),
    "bf16_f32": (
        "{q} float hx_bf16_f32({u16} h) {{\n"
        "  union {{ float f; {u32} u; }} v; v.u = ({u32})h << 16; return v.f;\n}}"
    ),
}

# Small helpers, emitted only when used; {t} is the C type, {s} the dtype's short name.
_HELPERS = {
    "floordiv_int": (
        "{q} {t} hx_floordiv_{s}({t} a, {t} b) {{\n"
        "  {t} q = a / b, r = a % b;\n"
        "  return q - ((r != 0) & ((r < 0) != (b < 0)));\n}}"
    ),
    "floormod_int": (
        "{q} {t} hx_floormod_{s}({t} a, {t} b) {{\n"
        "  {t} r = a % b;\n"
        "  return ((r != 0) & ((r < 0) != (b < 0))) ? r + b : r;\n}}"
    ),
    "floordiv_float": "{q} {t} hx_floordiv_{s}({t} a, {t} b) {{ return {f}(a / b); }}",
    # numpy's float remainder: the sign of the divisor.
    "floormod_float": (
        "{q} {t} hx_floormod_{s}({t} a, {t} b) {{\n"
        "  {t} r = {m}(a, b);\n"
        "  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;\n}}"
    ),
    # A compare-and-select (not fmin/fmax) so GCC vectorizes it to one min/max instruction.
    "min": "{q} {t} hx_min_{s}({t} a, {t} b) {{ return a < b ? a : b; }}",
    "max": "{q} {t} hx_max_{s}({t} a, {t} b) {{ return a > b ? a : b; }}",
}
TRUE, FALSE = IntImm(1, "bool"), IntImm(0, "bool")


def dot_helper(qualifier: str, name: str, feature: str, acc: str, vector: str, call: str) -> str:
    """A dot intrinsic on the 16 accumulators (C type `acc`, vector type `vector`) at c: the
    operand read once for every accumulator, 4 bytes at a, broadcast (`four`); the other, 64
    bytes at b (`wide`); `call` the instruction on `acc`, `four` and `wide`. Compiled where
    the compiler targets `feature` only; elsewhere the nest prints as loops."""
    return (
        f"#if defined({feature})\n"
        f"{qualifier} void {name}({acc}* c, const void* a, const void* b) {{\n"
        f"  {vector} acc; __m512i wide; int32_t four;\n"
        "  __builtin_memcpy(&acc, c, 64);\n"
        "  __builtin_memcpy(&four, a, 4);\n"
        "  __builtin_memcpy(&wide, b, 64);\n"
        f"  acc = {call};\n"
        "  __builtin_memcpy(c, &acc, 64);\n"
        "}\n"
        "#endif"
    )


# Per intrinsic (tensorize.py): (the helper's name, feature, accumulator C type, vector type,
# call) by whether the broadcast operand is uint8 (VNNI: vpdpbusd takes the uint8 one first).
_DOT_CALLS = {
    ("x86_vnni_dot_u8s8", True): (
        "hx_dpbusd_u", "__AVX512VNNI__", "int32_t", "__m512i",
        "_mm512_dpbusd_epi32(acc, _mm512_set1_epi32(four), wide)",
    ),
    ("x86_vnni_dot_u8s8", False): (
        "hx_dpbusd_s", "__AVX512VNNI__", "int32_t", "__m512i",
        "_mm512_dpbusd_epi32(acc, wide, _mm512_set1_epi32(four))",
    ),
    ("x86_bf16_dot_f32", False): (
        "hx_dpbf16", "__AVX512BF16__", "float", "__m512",
        "_mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(four), (__m512bh)wide)",
    ),
}  # fmt: skip


# Below this many iterations of its loops in all, a kernel runs on one core: starting and
# joining the threads of a parallel loop costs about 2 us, more than the work (gpt2-decode's
# layer_norm over 1x768 and slices of 768: 4-10 us a kernel in parallel; a relu over 3072
# floats 2.9 us in parallel, 1.0 us on one core). The default schedule applies it at fixed
# sizes; a loop of symbolic extent asks at run time (an `if` clause of its pragma).
MIN_PARALLEL_ITERATIONS = 32768


def auto_unrolled(loop: For, step: int) -> bool:
    """Whether a serial `loop` is unrolled under an enclosing AUTO_UNROLL_KEY of `step` (see
    `CPrinter.auto_unrolls`; the CUDA printer and the GPU analyzer share the rule)."""
    if loop.kind != "serial":
        return False
    iterations = nest_iterations(loop)
    if isinstance(iterations, Sym):
        return False
    return 1 < iterations <= step and iterations * nodes(loop.body) <= AUTO_UNROLL_MAX_NODES


def nest_iterations(loop: For) -> Dim:
    """The iterations of `loop`'s nest: its extent times the largest nest inside it (a Sym
    where an extent is symbolic)."""
    inner = [nest_iterations(n) for n in _outermost_loops(loop.body)]
    fixed = [n for n in inner if isinstance(n, int)]
    if len(fixed) < len(inner):
        symbolic = [n for n in inner if isinstance(n, Sym)]
        return loop.extent * symbolic[0] if isinstance(loop.extent, int) else loop.extent
    return loop.extent * max(fixed, default=1)


def _outermost_loops(stmt: Stmt) -> list[For]:
    if isinstance(stmt, For):
        return [stmt]
    inner = (c for c in children(stmt) if isinstance(c, StmtBase))
    return [f for child in inner for f in _outermost_loops(child)]  # type: ignore[arg-type]


# A heap buffer kept per thread between calls (CPrinter.scratch_slot); it is never freed: a
# kernel's threads (the caller's and OpenMP's pool) live as long as the process.
_SCRATCH = """typedef struct {{ void* data; size_t size; }} hx_scratch_t;
static inline void* hx_scratch(hx_scratch_t* s, size_t size) {{
  if (s->size < size) {{
    free(s->data);
    s->data = aligned_alloc({align}, size);
    s->size = s->data ? size : 0;
  }}
  return s->data;
}}"""


def generate_c(
    func: PrimFunc,
    target: Target | None = None,
    *,
    vector_math: bool = True,
    max_lines: int | None = None,
) -> str:
    """The C source of `func`, exporting `void <kernel_symbol(func)>(T* restrict ..., ...)`.
    `vector_math`: exp, erf, ... in a vectorized loop as SIMD helpers (c_math.py); off, such a
    loop stays a scalar `omp simd` loop of libm calls (the `vector_math` knob). `max_lines`:
    raise SourceTooLong as soon as the function's body passes that many lines, or its
    lowering copies too much to print within them (c_lower.py's PIECE_NODES_PER_LINE): the
    search refuses such candidates, and the long ones took most of its printing time. A body
    printed past it inside a vectorization attempt raises too, though the attempt might have
    given up for a scalar loop; that is shorter than the vectors only where the attempt
    fails, seldom so late."""
    return CPrinter(target, vector_math=vector_math, max_lines=max_lines).print_func(func)


class CPrinter:
    """Prints a PrimFunc as C. Target differences live in the class attributes and the
    `ctype`, `func_signature`, `preamble`, `loop`, `loop_pragmas`, `allocate` and `barrier`
    methods, which a CUDA printer overrides. The vector width comes from the target (its
    fp32 lanes; 16, AVX-512, without one, so printing is the same on every machine)."""

    includes: tuple[str, ...] = ("math.h", "stdbool.h", "stdint.h", "stdlib.h")
    export = '__attribute__((visibility("default")))'
    restrict = "restrict"
    helper_qualifier = "static inline"
    # float32 <-> the narrow floats without a C cast of their own
    conversions = {**BF16_HELPERS, **float8_helpers(), **float4_helpers(), **sub_byte_helpers()}
    indent_unit = "  "
    stack_limit_bytes = 64 * 1024  # larger shared/local buffers go to the heap
    # A global-scope intermediate this small (an rfactor's partial sums, a row of exp values)
    # is a stack array too, which the compiler can keep in registers; larger ones, the heap.
    small_global_bytes = 4096
    alignment = 64

    def __init__(
        self,
        target: Target | None = None,
        *,
        vector_math: bool = True,
        max_lines: int | None = None,
    ) -> None:
        self.target = target
        self.vector_math = vector_math
        self.max_lines = max_lines
        self.vector_bytes = 4 * (target.vector_width if target is not None else 16)
        self._lines: list[str] = []
        self._depth = 0
        self._helpers: dict[str, str] = {}
        self.extra_includes: set[str] = set()  # headers a helper needs (immintrin.h)
        self._uses_omp = False
        self._in_parallel = False
        self._in_simd = False
        self._unroll_step = 0  # the enclosing loop's AUTO_UNROLL_KEY (0: none)
        self.ranges: dict[Var, int] = {}  # extents of the vars in scope, for the simplifier
        self.registers: dict[Buffer, int] = {}  # local buffers held as vectors -> lanes
        self.prefetches: dict[Var, list[Prefetch]] = {}  # by the loop that issues them
        # (output, input) params the memory plan may run over one another (c_inplace.py)
        self.in_place_pairs: set[tuple[Buffer, Buffer]] = set()
        self.allocated: set[Buffer] = set()  # buffers we allocate (so aligned to `alignment`)
        self.names = Names(C_KEYWORDS | LIBRARY_NAMES)

    # -- output ---------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        self._lines.append(self.indent_unit * self._depth + line if line else "")
        if self.max_lines is not None and len(self._lines) > self.max_lines:
            raise SourceTooLong(f"past {self.max_lines} lines")

    @contextmanager
    def scope(self, opener: str, closer: str = "}") -> Iterator[None]:
        self.emit(opener)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.emit(closer)

    def checkpoint(self) -> tuple[int, int, dict[str, str]]:
        return len(self._lines), self._depth, dict(self._helpers)

    def rollback(self, mark: tuple[int, int, dict[str, str]]) -> None:
        """Forget what was printed since `mark` (a vectorization attempt that gave up)."""
        del self._lines[mark[0] :]
        self._depth, self._helpers = mark[1], mark[2]

    def print_func(self, func: PrimFunc) -> str:
        symbol = kernel_symbol(func)
        self.names = Names(C_KEYWORDS | LIBRARY_NAMES | {symbol})
        self.in_place_pairs = in_place_candidates(func)
        body = lower_for_c(func.body, self.in_place_pairs, self.max_lines)
        self.registers = register_buffers(body, self.vector_bytes)
        with self.scope(self.func_signature(func, symbol) + " {"):
            self.stmt_list(body)
        body_lines = self._lines
        return "\n".join([*self.preamble(), "", *body_lines]) + "\n"

    def func_signature(self, func: PrimFunc, symbol: str) -> str:
        params = ", ".join(
            [f"{self.ctype(b.dtype)}* {self.restrict} {self.names(b, b.name)}" for b in func.params]
            + [f"int64_t {self.var(symbol_var(name))}" for name in func.symbols]
        )
        tensorized = any(dict(loop.annotations).get(TENSORIZE) for loop in all_loops(func.body))
        # GCC's partial redundancy elimination, around a tensorized register tile whose
        # write-back reads another array (a zero point's correction), kept the accumulators
        # in memory (55 stack accesses in the loop against 13; 460 against 880 GOP/s).
        attribute = '__attribute__((optimize("no-tree-pre"))) ' if tensorized else ""
        return f"HX_EXPORT {attribute}void {symbol}({params or 'void'})"

    def preamble(self) -> list[str]:
        includes = self.includes + tuple(sorted(self.extra_includes))
        includes += ("omp.h",) if self._uses_omp else ()
        lines = [f"#include <{name}>" for name in includes]
        lines.append(f"#define HX_EXPORT {self.export}")
        if self._uses_omp:
            # The thread count is set at run time (knobs.num_threads), so it stays out of the
            # source and the build cache key.
            lines += [
                "static int hx_threads = 0;",
                "HX_EXPORT void hexir_set_num_threads(int n) { hx_threads = n; }",
                "static inline int hx_num_threads(void) {",
                "  return hx_threads > 0 ? hx_threads : omp_get_num_procs();",
                "}",
            ]
        return lines + list(self._helpers.values())

    # -- types and names ------------------------------------------------------------------

    def ctype(self, dtype: str) -> str:
        return c_type(dtype)

    def var(self, v: Var) -> str:
        return self.names(v, v.name)

    def dim(self, extent: Dim) -> str:
        """An extent in C: a number, or its symbols' arguments combined."""
        return str(extent) if isinstance(extent, int) else self.bare(dim_expr(extent))

    def add_helper(self, name: str, text: str) -> None:
        """Define helper `name` (once) above the kernel."""
        self._helpers.setdefault(name, text)

    def helper(self, kind: str, dtype: str) -> str:
        t, s = self.ctype(dtype), short_name(dtype)
        name = f"hx_{kind.split('_')[0]}_{s}"
        if name not in self._helpers:
            f32 = dtype == "float32"
            self._helpers[name] = _HELPERS[kind].format(
                q=self.helper_qualifier,
                t=t,
                s=s,
                f="floorf" if f32 else "floor",
                m="fmodf" if f32 else "fmod",
            )
        return name

    def vector_type(self, dtype: str, lanes: int) -> str:
        """The GCC vector type of `lanes` elements of `dtype` (declared on first use)."""
        name = f"hx_{short_name(dtype)}x{lanes}"
        if name not in self._helpers:
            size = lanes * itemsize(dtype)
            self._helpers[name] = (
                f"typedef {self.ctype(dtype)} {name} __attribute__((vector_size({size})));"
            )
        return name

    def vector_helper(self, kind: str, dtype: str, lanes: int) -> str:
        sv = f"{short_name(dtype)}x{lanes}"
        name = f"hx_{kind}_{sv}"
        if name in self._helpers:
            return name
        features = getattr(self.target, "features", ())  # none: the portable helpers
        intrinsic = x86_intrinsic(kind, dtype, lanes * itemsize(dtype), features)
        if intrinsic is not None:
            self.extra_includes.add("immintrin.h")
            v = self.vector_type(dtype, lanes)
            self._helpers[name] = INTRINSIC_HELPER.format(
                q=self.helper_qualifier, v=v, kind=kind, sv=sv, intrinsic=intrinsic
            )
            return name
        for need in HELPER_NEEDS.get(kind, ()):
            self.vector_helper(need, dtype, lanes)
        if kind == "widen_bytes":  # int8 / uint8 lanes to int32 lanes
            src, i32 = self.vector_type(dtype, lanes), self.vector_type("int32", lanes)
            helper = widen_bytes_helper(self.helper_qualifier, dtype, lanes, src, i32, features)
            if "_mm" in helper:
                self.extra_includes.add("immintrin.h")
            self._helpers[name] = helper
            return name
        if kind in ("widen", "narrow"):  # bfloat16 <-> float32
            f32, bf16 = self.vector_type("float32", lanes), self.vector_type("bfloat16", lanes)
            u32 = self.vector_type("uint32", lanes)
            helper = bfloat16_helper(self.helper_qualifier, kind, lanes, f32, bf16, u32)
            self._helpers[name] = helper
            return name
        if kind in HORIZONTAL.values():  # hsum, hmax, hmin
            v, t = self.vector_type(dtype, lanes), self.ctype(dtype)
            self._helpers[name] = horizontal_helper(self.helper_qualifier, kind, v, t, sv, lanes)
            return name
        if kind not in VECTOR_HELPERS:  # exp, erf, ...
            for need, need_dtype in MATH_NEEDS.get((kind, dtype), ()):
                self.vector_helper(need, need_dtype, lanes)
            self._helpers[name] = math_helper(self, kind, dtype, lanes)
            return name
        template = VECTOR_HELPERS[kind]
        mask = f"int{8 * itemsize(dtype)}"  # a signed integer as wide as an element
        fields = dict(
            q=self.helper_qualifier,
            v=self.vector_type(dtype, lanes),
            m=self.vector_type(mask, lanes) if "{m}" in template else "",
            t=self.ctype(dtype),
            n=lanes * itemsize(dtype),
            sv=sv,
            splat=", ".join(["s"] * lanes),
            absmask=f"{mask.upper()}_MAX",
            kind=kind,
        )
        self._helpers[name] = template.format(**fields)
        return name

    # -- statements -----------------------------------------------------------------------

    def stmt_list(self, stmt: Stmt) -> None:
        """Statements of one C scope; an Allocate lives until the end of it."""
        frees: list[str] = []
        for s in stmt.stmts if isinstance(stmt, Seq) else (stmt,):
            if isinstance(s, Allocate):
                frees += self.allocate(s.buffer)
            else:
                self.stmt(s)
        for line in reversed(frees):
            self.emit(line)

    def stmt(self, stmt: Stmt) -> None:
        match stmt:
            case For():
                self.loop(stmt)
            case Block(name, body=body):
                # Lowered: a block is its name around plain statements (c_lower).
                with self.scope(f"{{  // block {name}" if name else "{"):
                    self.stmt_list(body)
            case BufferStore(buffer, indices, value):
                self.emit(f"{self.access(buffer, indices)} = {self.bare(value)};")
            case IfThenElse():
                self.if_then_else(stmt, self.stmt_list)
            case Barrier():
                self.barrier()
            case Seq() | Allocate():
                with self.scope("{"):
                    self.stmt_list(stmt)
            case _:
                raise TypeError(f"not a hextir statement: {type(stmt).__name__}")

    def if_then_else(self, stmt: IfThenElse, body: BodyPrinter) -> None:
        """An `if`, its branches printed by `body`; a condition the ranges decide prints none."""
        cond = simplify(stmt.cond, self.ranges)
        if cond in (TRUE, FALSE):
            taken = stmt.then if cond == TRUE else stmt.else_
            if taken is not None:
                with self.scope("{") if _declares(taken) else nullcontext():
                    body(taken)
            return
        with self.scope(f"if ({self.bare(cond)}) {{"):
            body(stmt.then)
        if stmt.else_ is not None:
            self._lines.pop()  # the `}` closing the then-branch
            with self.scope("} else {"):
                body(stmt.else_)

    def loop(self, loop: For) -> None:
        distance = dict(loop.annotations).get(PREFETCH)
        if isinstance(distance, int) and distance > 0:
            self.prefetches.update(prefetch_plan(loop, distance, self.ranges))
        intrinsic = dict(loop.annotations).get(TENSORIZE)
        if isinstance(intrinsic, str) and self.tensorized(loop, intrinsic):
            return
        if loop.kind == "vectorized" and not self._in_simd:
            lanes = loop_lanes(loop, self.vector_bytes)
            if reduces_across(loop):
                if lanes is None or not emit_lane_reduction(self, loop, lanes):
                    self.scalar_loop(replace(loop, kind="serial"))  # no omp simd: it carries
                return
            if lanes is not None and emit_vector_loop(self, loop, lanes):
                return
        self.scalar_loop(loop)

    def tensorized(self, loop: For, intrinsic: str) -> bool:
        """`loop`'s nest as its intrinsic where the compiler targets the instruction, as the
        nest itself elsewhere (`hexir/schedule/tensorize.py`); False where the nest as lowered
        no longer matches (then it prints as loops)."""
        known = INTRINSICS.get(intrinsic)
        if isinstance(known, TileIntrinsic):
            return self.tile_call(loop, known)
        found = match_dot(loop, known, self.ranges) if isinstance(known, Intrinsic) else None
        if not isinstance(found, DotMatch) or self._in_simd:
            return False
        self.extra_includes.add("immintrin.h")
        unsigned = found.broadcast.buffer.dtype == "uint8"
        name, feature, acc, vector, instruction = _DOT_CALLS[(intrinsic, unsigned)]
        if name not in self._helpers:
            self._helpers[name] = dot_helper(
                self.helper_qualifier, name, feature, acc, vector, instruction
            )
        c = self.access(found.acc, found.acc_index)
        a, b = (self.access(x.buffer, x.indices) for x in (found.broadcast, found.wide))
        self.emit(f"#if defined({feature})")
        call = f"{name}(({acc}*)&{c}, &{a}, &{b});"
        if found.guard is None:
            self.emit(call)
        else:
            with self.scope(f"if ({self.bare(found.guard)}) {{"):
                self.emit(call)
        self.emit("#else")
        self.scalar_loop(loop)
        self.emit("#endif")
        return True

    def tile_call(self, loop: For, intrinsic: TileIntrinsic) -> bool:
        """A tile nest as its AMX helper's call (hexir/codegen/c_amx.py) where the compiler
        targets AMX and the process may use it, as the loops elsewhere; False where the nest
        as lowered no longer matches."""
        found = match_tile(loop, intrinsic, self.ranges)
        if not isinstance(found, TileMatch) or self._in_simd:
            return False
        self.extra_includes.add("immintrin.h")
        name, condition, sources = tile_helpers(intrinsic, found)
        for helper, source in sources.items():
            self._helpers.setdefault(helper, source)
        tiles = {"acc": found.acc, "a": found.a, "b": found.b}
        access = {k: self.access(x.buffer, x.indices) for k, x in tiles.items()}
        call = f"{name}({tile_arguments(found, access, self.bare(found.rows))});"
        self.emit(f"#if {condition}")
        with self.scope("if (hx_amx_ready()) {"):
            if found.guard is None:
                self.emit(call)
            else:
                with self.scope(f"if ({self.bare(found.guard)}) {{"):
                    self.emit(call)
        self._lines[-1] = self._lines[-1] + " else"
        self.emit("#endif")
        with self.scope("{"):
            self.scalar_loop(loop)
        return True

    def scalar_loop(self, loop: For, start: int = 0) -> None:
        """`loop` as a C for loop from `start` (a vector loop's scalar tail starts later)."""
        saved = (self._in_parallel, self._in_simd, self._unroll_step)
        for line in self.loop_pragmas(loop) if start == 0 else []:
            self.emit(line)
        step = dict(loop.annotations).get(AUTO_UNROLL_KEY)
        if isinstance(step, int) and not isinstance(step, bool):
            self._unroll_step = step
        v, t = self.var(loop.var), self.ctype(loop.var.dtype)
        header = f"for ({t} {v} = {start}; {v} < {self.dim(loop.extent)}; ++{v}) {{"
        with self.scope(header), self.bind_ranges({loop.var: loop.extent}):
            for p in self.prefetches.get(loop.var, ()):
                with self.scope(f"if ({self.bare(p.guard)}) {{"):
                    first = self.access(p.buffer, p.indices)
                    for line in range(p.lines):
                        self.emit(f"__builtin_prefetch((const char*)&{first} + {line * LINE});")
            self.stmt_list(loop.body)
        self._in_parallel, self._in_simd, self._unroll_step = saved

    def auto_unrolls(self, loop: For) -> bool:
        """Whether a serial `loop` is small enough to unroll under the enclosing loop's
        AUTO_UNROLL_KEY: its nest makes at most that many iterations, and its copies stay
        within AUTO_UNROLL_MAX_NODES (8 x 6 x 4 nested pragmas around 8 `omp simd` loops, 127
        lines of C, took GCC over a minute)."""
        return auto_unrolled(loop, self._unroll_step)

    @contextmanager
    def bind_ranges(self, extents: dict[Var, Dim]) -> Iterator[None]:
        saved = dict(self.ranges)
        self.ranges.update((v, e) for v, e in extents.items() if isinstance(e, int))
        try:
            yield
        finally:
            self.ranges = saved

    def loop_pragmas(self, loop: For) -> list[str]:
        """Pragmas before `loop`; they also mark what the loop's body runs inside."""
        if loop.kind == "parallel" and loop.extent == 1:
            return []  # one job: no threads to start
        if loop.kind == "parallel" and not (self._in_parallel or self._in_simd):
            self._uses_omp = self._in_parallel = True
            pragma = "#pragma omp parallel for num_threads(hx_num_threads())"
            iterations = nest_iterations(loop)
            if isinstance(iterations, Sym):  # too few at run time: no threads to start
                pragma += f" if({self.dim(iterations)} >= {MIN_PARALLEL_ITERATIONS})"
            return [pragma]
        if loop.kind == "vectorized" and not self._in_simd:
            # omp simd may not contain another simd or a parallel region.
            self._in_simd = True
            return ["#pragma omp simd"]
        if loop.kind == "unrolled":  # too large to unroll in the source (c_lower)
            return [f"#pragma GCC unroll {unroll_factor(loop)}"]
        if loop.kind in GPU_KINDS:
            return [f"// {loop.kind}: serial on the CPU"]
        if self.auto_unrolls(loop):
            return [f"#pragma GCC unroll {loop.extent}"]
        return []

    def allocate(self, buffer: Buffer) -> list[str]:
        """Declare `buffer`; return the lines that release it at the end of the scope."""
        t, name = self.ctype(buffer.dtype), self.names(buffer, buffer.name)
        self.allocated.add(buffer)
        nbytes = buffer.size * itemsize(buffer.dtype)
        if buffer in self.registers:
            lanes = self.registers[buffer]
            dims = "".join(f"[{d}]" for d in (*buffer.shape[:-1], buffer.shape[-1] // lanes))
            self.emit(f"{self.vector_type(buffer.dtype, lanes)} {name}{dims};")
            return []
        limit = self.small_global_bytes if buffer.scope == "global" else self.stack_limit_bytes
        if isinstance(nbytes, Sym):  # a size known at run time: the heap's, aligned
            slot, size = self.scratch_slot(), self.dim(nbytes + self.alignment - 1)
            aligned = f"(size_t)({size}) / {self.alignment} * {self.alignment}"
            self.emit(f"{t}* {self.restrict} {name} = ({t}*)hx_scratch(&{slot}, {aligned});")
            return []
        if nbytes > limit:
            padded = max(-(-nbytes // self.alignment) * self.alignment, self.alignment)
            slot = self.scratch_slot()
            self.emit(f"{t}* {self.restrict} {name} = ({t}*)hx_scratch(&{slot}, {padded});")
            return []
        self.emit(f"{t} {name}[{max(buffer.size, 1)}] __attribute__((aligned({self.alignment})));")
        return []

    def scratch_slot(self) -> str:
        """A new thread-local scratch slot (`hx_scratch`): heap buffers are kept from one call
        to the next, per thread, and grow when needed. Allocated and freed on every call (or
        every parallel job), a buffer past malloc's mmap threshold (a conv's packed weights)
        is fresh pages each time, and their faults cost as much as the copy into them."""
        if "hx_scratch" not in self._helpers:
            self._helpers["hx_scratch"] = _SCRATCH.format(align=self.alignment)
        slot = f"hx_scratch_{sum(k.startswith('hx_scratch_') for k in self._helpers)}"
        self._helpers[slot] = f"static _Thread_local hx_scratch_t {slot};"
        return slot

    def barrier(self) -> None:
        # Thread-bound loops run one after another on the CPU: nothing to wait for.
        self.emit("// barrier")

    # -- expressions ----------------------------------------------------------------------

    def flat(self, buffer: Buffer, indices: tuple[Expr, ...]) -> Expr:
        if len(indices) != len(buffer.shape):
            raise BuildError(
                f"buffer {buffer.name} has {len(buffer.shape)} dimensions, "
                f"indexed with {len(indices)}"
            )
        return flat_index(buffer, indices, self.ranges)

    def access(self, buffer: Buffer, indices: tuple[Expr, ...]) -> str:
        name = self.names(buffer, buffer.name)
        if buffer in self.registers:  # one element of an array of vectors
            self.flat(buffer, indices)  # checks the dimensions
            *outer, last = indices
            lanes = IntImm(self.registers[buffer], last.dtype)
            split = (Binary("floordiv", last, lanes), Binary("floormod", last, lanes))
            subs = [simplify(i, self.ranges) for i in (*outer, *split)]
            return name + "".join(f"[{self.bare(i)}]" for i in subs)
        return f"{name}[{self.bare(self.flat(buffer, indices))}]"

    def bare(self, e: Expr) -> str:
        """`e` without the outer parentheses, where its context needs none (`x = a + b;`)."""
        text = self.expr(e)
        # A Binary printed as `(...)` is wrapped whole (helpers print as calls).
        return text[1:-1] if isinstance(e, Binary) and text.startswith("(") else text

    def expr(self, e: Expr) -> str:
        match e:
            case Var():
                return self.var(e)
            case IntImm(value, dtype):
                return self.int_literal(value, dtype)
            case FloatImm(value, dtype):
                return self.float_literal(value, dtype)
            case Binary(op, a, b):
                return self.binary(op, a, b)
            case Unary(op, a):
                return f"({op}{self.expr(a)})"
            case Call(name, args):
                return self.call(name, args[0])
            case Select(cond, then, else_):
                return f"({self.expr(cond)} ? {self.expr(then)} : {self.expr(else_)})"
            case Cast(dtype, value):
                return self.cast(dtype, value)
            case BufferLoad(buffer, indices):
                return self.access(buffer, indices)
            case _:
                raise TypeError(f"not a hextir expression: {type(e).__name__}")

    def int_literal(self, value: int, dtype: str) -> str:
        if dtype == "bool":
            return "true" if value else "false"
        self.ctype(dtype)
        limits = np.iinfo(numpy_dtype(dtype) if is_int(dtype) else np.int64)
        if not limits.min <= value <= limits.max:
            raise BuildError(f"integer constant {value} does not fit {dtype}")
        if dtype == "int64":
            return "INT64_MIN" if value == limits.min else f"INT64_C({value})"
        if dtype in ("uint32", "uint64"):
            return f"UINT{dtype[4:]}_C({value})"
        if value == -(2**31):  # -2147483648 in C is the negation of a too-large literal
            return "INT32_MIN"
        return f"({value})" if value < 0 else str(value)

    def float_literal(self, value: float, dtype: str) -> str:
        self.ctype(dtype)
        if dtype == "float32":
            with np.errstate(over="ignore"):  # a value beyond float32 is its infinity
                value = float(np.float32(value))
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "(-INFINITY)"
        # The shortest decimal that reads back to the same value in the dtype: exact.
        text = str(np.float32(value)) if dtype == "float32" else repr(float(value))
        if "." not in text and "e" not in text:
            text += ".0"
        text += "f" if dtype == "float32" else ""
        return f"({text})" if text.startswith("-") else text

    def binary(self, op: str, a: Expr, b: Expr) -> str:
        x, y, dtype = self.expr(a), self.expr(b), a.dtype
        if op in ("floordiv", "floormod"):
            if not is_float(dtype) and self.lower_bound(a) >= 0 and self.lower_bound(b) > 0:
                # C's truncating / and % agree with floor semantics here, and read better.
                return f"({x} {'/' if op == 'floordiv' else '%'} {y})"
            kind = f"{op}_{'float' if is_float(dtype) else 'int'}"
            return f"{self.helper(kind, dtype)}({x}, {y})"
        if op in ("min", "max"):
            return f"{self.helper(op, dtype)}({x}, {y})"
        if op in BIT_OPERATORS:  # narrow ints computed as int: wrapped back
            return f"(({self.ctype(dtype)})({x} {BIT_OPERATORS[op]} {y}))"
        if op == "fmod":  # the remainder of truncating division
            if is_float(dtype):
                return f"{'fmodf' if dtype == 'float32' else 'fmod'}({x}, {y})"
            return f"(({self.ctype(dtype)})({x} % {y}))"
        if op == "pow":
            if is_float(dtype):
                return f"{'powf' if dtype == 'float32' else 'pow'}({x}, {y})"
            return f"(({self.ctype(dtype)})pow((double){x}, (double){y}))"
        if op in ("+", "-", "*", "/") and is_int(dtype) and itemsize(dtype) < 4:
            # C computes narrow integers as int: wrap the result as numpy does.
            return f"(({self.ctype(dtype)})({x} {op} {y}))"
        return f"({x} {op} {y})"

    def lower_bound(self, e: Expr) -> float:
        lo = bound(e, self.ranges).lo
        return -math.inf if lo is None else lo

    def call(self, name: str, arg: Expr) -> str:
        x, dtype = self.expr(arg), arg.dtype
        if not is_float(dtype):
            return self.int_call(name, x, dtype)
        f = "f" if dtype == "float32" else ""
        one = self.float_literal(1.0, dtype)
        if name == "rsqrt":
            return f"({one} / sqrt{f}({x}))"
        if name == "sigmoid":
            return f"({one} / ({one} + exp{f}(-{x})))"
        return f"{_MATH[name]}{f}({x})"

    def int_call(self, name: str, x: str, dtype: str) -> str:
        if name in ("floor", "ceil", "round"):
            return x
        if name == "abs" and is_unsigned(dtype):
            return x
        if name == "abs" and dtype != "bool":
            return f"{'llabs' if dtype == 'int64' else 'abs'}({x})"
        raise BuildError(f"math call {name} on {dtype} is not supported by the C backend")

    def cast(self, dtype: str, value: Expr) -> str:
        x = self.expr(value)
        if dtype == value.dtype:
            return x
        if value.dtype in SUB_BYTE_INTS:  # its value from the low bits (ml_dtypes' storage)
            x = sub_byte_value(x, value.dtype)
        kind = f"{short_name(value.dtype)}_{short_name(dtype)}"
        if kind in self.conversions:  # a narrow float or into a sub-byte int (c_narrow.py)
            if kind not in self._helpers:
                i8, u8, u16, u32 = (self.ctype(t) for t in ("int8", "uint8", "uint16", "uint32"))
                template = self.conversions[kind]
                self._helpers[kind] = template.format(
                    q=self.helper_qualifier, i8=i8, u8=u8, u16=u16, u32=u32
                )
            return f"hx_{kind}({x})"
        if dtype == "bool":
            return f"({x} != 0)"
        return f"(({self.ctype(dtype)}){x})"


def _declares(stmt: Stmt) -> bool:
    """Whether `stmt` declares a buffer in the scope it is printed in."""
    return any(isinstance(s, Allocate) for s in (stmt.stmts if isinstance(stmt, Seq) else (stmt,)))
