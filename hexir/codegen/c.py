"""C for any hextir PrimFunc: one C-like printer whose per-target data a CUDA printer overrides.

    source = generate_c(func)           # a translation unit exporting `kernel_symbol(func)`

Semantics of the loop kinds on the CPU: `parallel` is an OpenMP `parallel for` (the outermost
one only; nested ones run serially), `vectorized` an `omp simd` loop, `unrolled` a
`GCC unroll` loop, and GPU kinds (blockIdx.*, threadIdx.*, vthread) plain serial loops, so
that any GPU schedule's values can be checked on a CPU (DESIGN.md §3).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import numpy as np

from hexir.errors import BuildError
from hexir.ir.arith import bound, simplify
from hexir.ir.dtype import c_type, is_float, itemsize, short_name
from hexir.ir.tir import (
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
    Unary,
    Var,
)

if TYPE_CHECKING:  # codegen sits below runtime (STYLE.md): the type only
    from hexir.runtime.target import Target

_C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if "
    "inline int long register restrict return short signed sizeof static struct switch typedef "
    "union unsigned void volatile while bool true false main".split()
)
# Library names a kernel's identifiers must not shadow.
_LIBRARY_NAMES = frozenset(
    "exp expf log logf sqrt sqrtf tanh tanhf erf erff fabs fabsf floor floorf ceil ceilf sin sinf "
    "cos cosf pow powf fmod fmodf abs llabs div ldiv free malloc exit aligned_alloc INFINITY NAN "
    "int32_t int64_t omp_get_num_procs hexir_set_num_threads".split()
)
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
    "sin": "sin",
    "cos": "cos",
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
_INT_LIMITS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def generate_c(func: PrimFunc, target: Target | None = None) -> str:
    """The C source of `func`, exporting `void <kernel_symbol(func)>(T* restrict ..., ...)`."""
    return CPrinter(target).print_func(func)


def kernel_symbol(func: PrimFunc) -> str:
    """The exported C name of `func`'s kernel."""
    name = _sanitize(func.name)
    return f"{name}_kernel" if name in _C_KEYWORDS or name in _LIBRARY_NAMES else name


def _sanitize(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    # Leading digits and underscores, and our own hx_ prefix, are not the user's to take.
    return f"v{name}" if name[0].isdigit() or name[0] == "_" or name.startswith("hx_") else name


class _Names:
    """Unique C identifiers for vars and buffers (keyed by value: equal nodes share a name)."""

    def __init__(self, reserved: frozenset[str]):
        self._taken = set(reserved)
        self._names: dict[object, str] = {}

    def __call__(self, key: object, hint: str) -> str:
        if key not in self._names:
            base = name = _sanitize(hint)
            n = 1
            while name in self._taken:
                name, n = f"{base}_{n}", n + 1
            self._taken.add(name)
            self._names[key] = name
        return self._names[key]


class CPrinter:
    """Prints a PrimFunc as C. Target differences live in the class attributes and the
    `ctype`, `func_signature`, `preamble`, `loop`, `loop_pragmas`, `allocate` and `barrier`
    methods, which a CUDA printer overrides."""

    includes: tuple[str, ...] = ("math.h", "stdbool.h", "stdint.h", "stdlib.h")
    export = '__attribute__((visibility("default")))'
    restrict = "restrict"
    helper_qualifier = "static inline"
    indent_unit = "  "
    stack_limit_bytes = 64 * 1024  # larger shared/local buffers go to the heap
    alignment = 64

    def __init__(self, target: Target | None = None) -> None:
        self.target = target
        self._lines: list[str] = []
        self._depth = 0
        self._helpers: dict[str, str] = {}
        self._uses_omp = False
        self._in_parallel = False
        self._in_simd = False
        self._ranges: dict[Var, int] = {}  # extents of the vars in scope, for the simplifier
        self.names = _Names(_C_KEYWORDS | _LIBRARY_NAMES)

    # -- output ---------------------------------------------------------------------------

    def emit(self, line: str) -> None:
        self._lines.append(self.indent_unit * self._depth + line if line else "")

    @contextmanager
    def scope(self, opener: str, closer: str = "}") -> Iterator[None]:
        self.emit(opener)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self.emit(closer)

    def print_func(self, func: PrimFunc) -> str:
        symbol = kernel_symbol(func)
        self.names = _Names(_C_KEYWORDS | _LIBRARY_NAMES | {symbol})
        with self.scope(self.func_signature(func, symbol) + " {"):
            self.stmt_list(func.body)
        body = self._lines
        return "\n".join([*self.preamble(), "", *body]) + "\n"

    def func_signature(self, func: PrimFunc, symbol: str) -> str:
        params = ", ".join(
            f"{self.ctype(b.dtype)}* {self.restrict} {self.names(b, b.name)}" for b in func.params
        )
        return f"HX_EXPORT void {symbol}({params or 'void'})"

    def preamble(self) -> list[str]:
        includes = self.includes + (("omp.h",) if self._uses_omp else ())
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
        if dtype == "float16":
            raise BuildError("float16 is not supported by the C backend yet")
        return c_type(dtype)

    def var(self, v: Var) -> str:
        return self.names(v, v.name)

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
            case Block():
                self.block(stmt)
            case BufferStore(buffer, indices, value):
                self.emit(f"{self.access(buffer, indices)} = {self.bare(value)};")
            case IfThenElse(cond, then, else_):
                with self.scope(f"if ({self.expr(cond)}) {{"):
                    self.stmt_list(then)
                if else_ is not None:
                    self._lines.pop()  # the `}` closing the then-branch
                    with self.scope("} else {"):
                        self.stmt_list(else_)
            case Barrier():
                self.barrier()
            case Seq() | Allocate():
                with self.scope("{"):
                    self.stmt_list(stmt)
            case _:
                raise TypeError(f"not a hextir statement: {type(stmt).__name__}")

    def loop(self, loop: For) -> None:
        saved = (self._in_parallel, self._in_simd)
        for line in self.loop_pragmas(loop):
            self.emit(line)
        v = self.var(loop.var)
        header = f"for ({self.ctype(loop.var.dtype)} {v} = 0; {v} < {loop.extent}; ++{v}) {{"
        with self.scope(header), self.bind_ranges({loop.var: loop.extent}):
            self.stmt_list(loop.body)
        self._in_parallel, self._in_simd = saved

    @contextmanager
    def bind_ranges(self, extents: dict[Var, int]) -> Iterator[None]:
        saved = dict(self._ranges)
        self._ranges.update(extents)
        try:
            yield
        finally:
            self._ranges = saved

    def loop_pragmas(self, loop: For) -> list[str]:
        """Pragmas before `loop`; they also mark what the loop's body runs inside."""
        if loop.kind == "parallel" and not (self._in_parallel or self._in_simd):
            self._uses_omp = self._in_parallel = True
            return ["#pragma omp parallel for num_threads(hx_num_threads())"]
        if loop.kind == "vectorized" and not self._in_simd:
            # omp simd may not contain another simd or a parallel region.
            self._in_simd = True
            return ["#pragma omp simd"]
        if loop.kind == "unrolled":
            return [f"#pragma GCC unroll {min(loop.extent, 65534)}"]
        if loop.kind in GPU_KINDS:
            return [f"// {loop.kind}: serial on the CPU"]
        return []

    def block(self, block: Block) -> None:
        with self.scope(f"{{  // block {block.name}"):
            for iv in block.iter_vars:
                t = self.ctype(iv.var.dtype)
                self.emit(f"const {t} {self.var(iv.var)} = {self.bare(iv.binding)};")
            guard = (
                nullcontext()
                if block.predicate is None
                else self.scope(f"if ({self.bare(block.predicate)}) {{")
            )
            # Inside the predicate every iter var lies in its domain (the block's contract).
            with guard, self.bind_ranges({iv.var: iv.dom for iv in block.iter_vars}):
                self.block_body(block)

    def block_body(self, block: Block) -> None:
        if block.init is not None:
            reduce_vars = [iv.var for iv in block.iter_vars if iv.kind == "reduce"]
            if reduce_vars:
                first = " && ".join(f"{self.var(v)} == 0" for v in reduce_vars)
                with self.scope(f"if ({first}) {{"):
                    self.stmt_list(block.init)
            else:
                with self.scope("{"):
                    self.stmt_list(block.init)
        self.stmt_list(block.body)

    def allocate(self, buffer: Buffer) -> list[str]:
        """Declare `buffer`; return the lines that release it at the end of the scope."""
        t, name = self.ctype(buffer.dtype), self.names(buffer, buffer.name)
        nbytes = buffer.size * itemsize(buffer.dtype)
        if buffer.scope == "global" or nbytes > self.stack_limit_bytes:
            padded = max(-(-nbytes // self.alignment) * self.alignment, self.alignment)
            alloc = f"({t}*)aligned_alloc({self.alignment}, {padded})"
            self.emit(f"{t}* {self.restrict} {name} = {alloc};")
            return [f"free({name});"]
        self.emit(f"{t} {name}[{max(buffer.size, 1)}] __attribute__((aligned({self.alignment})));")
        return []

    def barrier(self) -> None:
        # Thread-bound loops run one after another on the CPU: nothing to wait for.
        self.emit("// barrier")

    # -- expressions ----------------------------------------------------------------------

    def access(self, buffer: Buffer, indices: tuple[Expr, ...]) -> str:
        if len(indices) != len(buffer.shape):
            raise BuildError(
                f"buffer {buffer.name} has {len(buffer.shape)} dimensions, "
                f"indexed with {len(indices)}"
            )
        flat = flat_index(buffer, indices, self._ranges)
        return f"{self.names(buffer, buffer.name)}[{self.bare(flat)}]"

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
        lo, hi = _INT_LIMITS.get(dtype, _INT_LIMITS["int64"])
        if not lo <= value <= hi:
            raise BuildError(f"integer constant {value} does not fit {dtype}")
        if dtype == "int64":
            return "INT64_MIN" if value == lo else f"INT64_C({value})"
        if value == lo:  # -2147483648 in C is the negation of a too-large literal
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
        if op == "pow":
            if is_float(dtype):
                return f"{'powf' if dtype == 'float32' else 'pow'}({x}, {y})"
            return f"(({self.ctype(dtype)})pow((double){x}, (double){y}))"
        return f"({x} {op} {y})"

    def lower_bound(self, e: Expr) -> float:
        lo = bound(e, self._ranges).lo
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
        if name in ("floor", "ceil"):
            return x
        if name == "abs" and dtype != "bool":
            return f"{'abs' if dtype == 'int32' else 'llabs'}({x})"
        raise BuildError(f"math call {name} on {dtype} is not supported by the C backend")

    def cast(self, dtype: str, value: Expr) -> str:
        x = self.expr(value)
        if dtype == value.dtype:
            return x
        if dtype == "bool":
            return f"({x} != 0)"
        return f"(({self.ctype(dtype)}){x})"


def flat_index(
    buffer: Buffer, indices: tuple[Expr, ...], ranges: dict[Var, int] | None = None
) -> Expr:
    """The row-major offset of `indices` into `buffer` (int64 where int32 could overflow),
    simplified knowing each var of `ranges` lies in [0, extent)."""
    wide = buffer.size > 2**31 - 1
    index_dtype = "int64" if wide else "int32"
    flat: Expr | None = None
    for extent, index in zip(buffer.shape, indices):
        if wide and index.dtype != "int64":
            index = Cast("int64", index)
        if flat is None:
            flat = index
        elif extent == 1:
            flat = _add(flat, index)  # (flat * 1) + index
        else:
            flat = _add(Binary("*", flat, IntImm(extent, index_dtype)), index)
    return simplify(flat if flat is not None else IntImm(0, index_dtype), ranges)


def _add(a: Expr, b: Expr) -> Expr:
    if isinstance(a, IntImm) and a.value == 0:
        return b
    if isinstance(b, IntImm) and b.value == 0:
        return a
    return Binary("+", a, b)
