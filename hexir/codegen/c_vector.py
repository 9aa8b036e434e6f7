"""Explicit SIMD for `vectorized` loops, through GCC vector extensions.

A vectorized loop `for x in 0..E` runs its body over chunks of `lanes` consecutive values of
x (lanes from `loop_lanes`: 16 fp32 lanes with AVX-512, 8 with AVX2): each store becomes one
vector store of a vector expression. A load unit-stride in x is a vector load (aligned where
the buffer is one we allocated and the offset a multiple of the chunk), a load free of x a
scalar that GCC broadcasts, any other load a gather of `lanes` scalar loads; a comparison is a
mask, `select` and min/max blend through it. At most `MAX_STRAIGHT_CHUNKS` chunks print as
straight-line code, more as a loop stepping by `lanes`; a remainder of at least half a vector
runs as one vector of half the lanes, the rest as a scalar tail. A local buffer kept in
registers (`register_buffers`) is an array of vectors indexed by chunk. Math calls with a
vector form (float32 exp, log, erf, tanh, sigmoid, sqrt, rsqrt and pow; float64 exp, log,
sigmoid, sqrt and rsqrt) call SIMD helpers (c_math.py), unless the printer's `vector_math`
is off; the scalar tail keeps libm's calls.

A vectorized loop that feeds a reduction (`out[i] = out[i] OP rhs`, OP one of + max min, the
store's index free of x; `sch.vectorize` allows it only then) combines its lanes in a tree:
the chunks of rhs combined vector by vector, then the lanes of that vector by halves
(`hx_hsum`, `hx_hmax`, `hx_hmin`), and the total combined into out once. Its init runs
first, under the lowered block's first-iteration condition at x = 0.

Anything else (a nested loop, an allocation, a condition or a store index that depends on x
other than by unit stride, a math call without a vector form, bools in memory) raises
`Unvectorizable`, and the printer prints the scalar loop under `#pragma omp simd` instead:
correctness first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexir.codegen.c_lower import MAX_STRAIGHT_CHUNKS
from hexir.codegen.c_math import has_vector_form
from hexir.codegen.c_names import BIT_OPERATORS
from hexir.ir.arith import affine_coefficients, simplify
from hexir.ir.dtype import SUB_BYTE_INTS, is_float, itemsize
from hexir.ir.narrow import BYTE_FLOATS
from hexir.ir.tir import (
    COMPARE_OPS,
    LOGIC_OPS,
    Allocate,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Call,
    Cast,
    Expr,
    For,
    IfThenElse,
    IntImm,
    Select,
    Seq,
    Stmt,
    Unary,
    Var,
)
from hexir.ir.visit import free_vars, substitute, walk

if TYPE_CHECKING:
    from hexir.codegen.c import CPrinter


class Unvectorizable(Exception):
    """The loop body holds something the vectorizer does not handle."""


@dataclass(frozen=True)
class VValue:
    """A C expression in a chunk: a vector, or (`vector` False) a scalar invariant in x.
    A bool vector is a mask whose elements are `mask_bytes` wide (-1 true, 0 false)."""

    text: str
    vector: bool
    dtype: str
    mask_bytes: int = 0


def emit_vector_loop(p: CPrinter, loop: For, lanes: int) -> bool:
    """Print `loop` as chunks of `lanes`; False (nothing printed) where it cannot."""
    mark = p.checkpoint()
    try:
        _emit_chunks(p, loop, lanes)
    except Unvectorizable:
        p.rollback(mark)
        return False
    return True


# The horizontal helpers by the reduction's operator (schedule/reduction.py's LANE_COMBINERS).
HORIZONTAL = {"+": "hsum", "max": "hmax", "min": "hmin"}


@dataclass(frozen=True)
class LaneReduction:
    """A lowered reduction block under a vectorized loop: `init` under `first` (or neither),
    then `out[indices] = out[indices] op rhs`."""

    name: str
    first: Expr | None
    init: Stmt | None
    update: BufferStore
    op: str
    rhs: Expr


def lane_reduction(loop: For) -> LaneReduction | None:
    """`loop`'s body as a reduction across its lanes (see the module's docstring), or None."""
    name, body = "", loop.body
    if isinstance(body, Block) and not body.iter_vars:
        name, body = body.name, body.body
    first = init = None
    if isinstance(body, Seq) and len(body.stmts) == 2 and isinstance(body.stmts[0], IfThenElse):
        cond = body.stmts[0]
        if cond.else_ is not None:
            return None
        first, init, body = cond.cond, cond.then, body.stmts[1]
    match body:
        case BufferStore(out, idx, Binary(op, BufferLoad(acc, acc_idx), rhs)) if (
            op in HORIZONTAL and acc == out and acc_idx == idx and is_float(out.dtype)
        ):
            if any(loop.var in free_vars(i) for i in idx) or any(
                isinstance(n, BufferLoad) and n.buffer == out for n in walk(rhs)
            ):
                return None
            return LaneReduction(name, first, init, body, op, rhs)
    return None


def reduces_across(loop: For) -> bool:
    """Whether a store under `loop` writes one element for all its iterations: a reduction
    over its var (which `#pragma omp simd` would race on)."""
    return any(
        isinstance(n, BufferStore) and all(loop.var not in free_vars(i) for i in n.indices)
        for n in walk(loop.body)
    )


def emit_lane_reduction(p: CPrinter, loop: For, lanes: int) -> bool:
    """Print a vectorized reduction loop as a tree over its lanes; False (nothing printed)
    where its body is not one `lane_reduction` or its chunks do not vectorize."""
    found = lane_reduction(loop)
    chunks, tail = divmod(loop.extent, lanes)
    if found is None or tail or chunks > MAX_STRAIGHT_CHUNKS:
        return False
    mark = p.checkpoint()
    dtype, x = found.update.buffer.dtype, loop.var
    try:
        with p.bind_ranges({x: loop.extent}):
            parts = [_Chunk(p, x, IntImm(c * lanes, x.dtype), lanes, False) for c in range(chunks)]
            vectors = [c.vector(c.value(found.rhs), dtype) for c in parts]
    except Unvectorizable:
        p.rollback(mark)
        return False
    combine = parts[0].helper(found.op, dtype) if found.op != "+" else None
    while len(vectors) > 1:  # pairwise, as the lanes are
        pairs = zip(vectors[::2], vectors[1::2], strict=False)
        odd = [vectors[-1]] if len(vectors) % 2 else []
        vectors = [f"{combine}({a}, {b})" if combine else f"({a} + {b})" for a, b in pairs] + odd
    total = f"{p.vector_helper(HORIZONTAL[found.op], dtype, lanes)}({_unwrap(vectors[0])})"
    out = found.update
    lanes_total = Var("lanes", dtype)  # the tree's result, a scalar local of the block
    with p.scope(f"{{  // block {found.name}" if found.name else "{"):
        if found.init is not None and found.first is not None:
            first = simplify(substitute(found.first, {x: IntImm(0, x.dtype)}), p.ranges)
            p.stmt(IfThenElse(first, found.init))
        elif found.init is not None:
            p.stmt(found.init)
        p.emit(f"{p.ctype(dtype)} {p.var(lanes_total)} = {total};")
        load = BufferLoad(out.buffer, out.indices)
        p.stmt(BufferStore(out.buffer, out.indices, Binary(found.op, load, lanes_total)))
    return True


def bfloat16_helper(q: str, kind: str, lanes: int, f32: str, bf16: str, u32: str) -> str:
    """`hx_widen_bf16x<lanes>` (bits to floats) or `hx_narrow_f32x<lanes>` (floats to bits, to
    the nearest, ties to even; a NaN stays a quiet NaN): c_narrow.py's conversions, lane-wise."""
    if kind == "widen":
        return (
            f"{q} {f32} hx_widen_bf16x{lanes}({bf16} h) {{\n"
            f"  return ({f32})(__builtin_convertvector(h, {u32}) << 16);\n}}"
        )
    return (
        f"{q} {bf16} hx_narrow_f32x{lanes}({f32} x) {{\n"
        f"  {u32} b = ({u32})x, nan = ({u32})(x != x);\n"
        f"  {u32} r = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;\n"
        f"  r = (r & ~nan) | (((b >> 16) | 0x40u) & nan);\n"
        f"  return __builtin_convertvector(r, {bf16});\n}}"
    )


def widen_bytes_helper(
    q: str, dtype: str, lanes: int, src: str, i32: str, features: tuple[str, ...]
) -> str:
    """`hx_widen_bytes_<u8|i8>x<lanes>`: 8-bit int lanes to int32 lanes, zero- or
    sign-extended. One vpmovzxbd / vpmovsxbd where the target has 16 (AVX-512) or 8 (AVX2)
    lanes of them: GCC 12 converts such a vector one byte at a time through the scalar
    registers (an int4 weight's GEMV: 5x slower). Elsewhere the portable conversion."""
    sign = "epi8" if dtype == "int8" else "epu8"
    name = f"hx_widen_bytes_{'i8' if dtype == 'int8' else 'u8'}x{lanes}({src} x)"
    if lanes == 16 and "avx512f" in features:
        body = f"__m128i b; __builtin_memcpy(&b, &x, 16); return ({i32})_mm512_cvt{sign}_epi32(b);"
    elif lanes == 8 and "avx2" in features:
        body = (
            "__m128i b = _mm_setzero_si128(); __builtin_memcpy(&b, &x, 8); "
            f"return ({i32})_mm256_cvt{sign}_epi32(b);"
        )
    else:
        body = f"return __builtin_convertvector(x, {i32});"
    return f"{q} {i32} {name} {{ {body} }}"


def horizontal_helper(q: str, kind: str, v: str, t: str, sv: str, lanes: int) -> str:
    """`hx_<kind>_<sv>`: the lanes of a vector combined by halves into one scalar."""
    step = "  v = {};\n"
    op = {"hsum": "v + {}", "hmax": f"hx_max_{sv}(v, {{}})", "hmin": f"hx_min_{sv}(v, {{}})"}
    lines = []
    half = lanes // 2
    while half:
        order = ", ".join(str(i ^ half) for i in range(lanes))  # lane i swaps with i ^ half
        lines.append(step.format(op[kind].format(f"__builtin_shufflevector(v, v, {order})")))
        half //= 2
    return f"{q} {t} hx_{kind}_{sv}({v} v) {{\n{''.join(lines)}  return v[0];\n}}"


def _emit_chunks(p: CPrinter, loop: For, lanes: int) -> None:
    chunks, tail = divmod(loop.extent, lanes)
    x = loop.var
    last = _last_vector(p, loop, lanes) if tail and chunks else None
    with p.bind_ranges({x: loop.extent}):
        if chunks <= MAX_STRAIGHT_CHUNKS:
            for c in range(chunks):
                _Chunk(p, x, IntImm(c * lanes, x.dtype), lanes, False).stmt(loop.body)
        else:
            v = p.var(x)
            header = f"for ({p.ctype(x.dtype)} {v} = 0; {v} < {chunks * lanes}; {v} += {lanes}) {{"
            with p.scope(header):
                _Chunk(p, x, x, lanes, True).stmt(loop.body)
    if last is not None:
        for line in last:
            p.emit(line)
        return
    start = chunks * lanes
    # A tail of at least half a vector runs as one narrower vector (AVX-512's 24 columns: 16
    # lanes and 8, where the 8 ran scalar: 3136x144 @ 144x24 0.129 -> 0.089 ms, MobileNetV2's
    # 1x1 convs to 24 channels in NHWC), unless its body reads a register array (chunks of
    # the full width) or cannot be vectorized narrower.
    half = lanes // 2
    if tail >= half >= MIN_TAIL_BYTES // itemsize(_dtype_of(loop)):
        mark = p.checkpoint()
        try:
            with p.bind_ranges({x: loop.extent}):
                _Chunk(p, x, IntImm(start, x.dtype), half, False).stmt(loop.body)
            start, tail = start + half, tail - half
        except Unvectorizable:
            p.rollback(mark)
    if tail:
        p.scalar_loop(loop, start=start)


def _last_vector(p: CPrinter, loop: For, lanes: int) -> list[str] | None:
    """A tail after at least one vector, in a loop whose body stores nothing it reads, as one
    more full vector ending at the loop's end: its values computed before the other vectors
    run, into temporaries, and the lines that store them, for after them (None where the body
    is not such). It computes the last few elements again, the same values into the same
    places; not where the memory plan may run the kernel over its input (`_recomputable`)
    (ViT's rows of 197: 12 vectors and 5 exps through libm a row; softmax 12x197x197 0.18 ->
    0.13 ms)."""
    if not _recomputable(p, loop.body):
        return None
    mark = p.checkpoint()
    chunk = _LastChunk(p, loop.var, IntImm(loop.extent - lanes, loop.var.dtype), lanes, False)
    try:
        with p.bind_ranges({loop.var: loop.extent}):
            chunk.stmt(loop.body)
    except Unvectorizable:
        p.rollback(mark)
        return None
    return chunk.stores


def _recomputable(p: CPrinter, body: Stmt) -> bool:
    """Whether running an iteration of `body` twice stores what it stored the first time,
    and reading its inputs first keeps that true: only stores, to buffers it does not read
    (no loop or allocation inside), and none to an output the memory plan may run over an
    input it loads (the C declares them `restrict`, so the compiler may read that input
    after the other vectors' stores)."""
    nodes = list(walk(body))
    if any(isinstance(n, For | Allocate) for n in nodes):
        return False
    stored = {n.buffer for n in nodes if isinstance(n, BufferStore)}
    loaded = {n.buffer for n in nodes if isinstance(n, BufferLoad)}
    if stored & loaded:
        return False
    return not any(o in stored and i in loaded for o, i in p.in_place_pairs)


# The narrowest vector a loop's tail takes (`_emit_chunks`): four float32s.
MIN_TAIL_BYTES = 16


def _dtype_of(loop: For) -> str:
    """The widest element the loop's stores write (what sets its lanes)."""
    dtypes = (n.buffer.dtype for n in walk(loop.body) if isinstance(n, BufferStore))
    return max(dtypes, key=itemsize, default="float32")


class _Chunk:
    """Prints one chunk of a vectorized loop's body: lanes x = base + 0 .. base + lanes - 1.
    `stepped`: base is x itself, stepping by `lanes` (so a multiple of it)."""

    def __init__(self, p: CPrinter, x: Var, base: Expr, lanes: int, stepped: bool):
        self.p, self.x, self.base, self.lanes, self.stepped = p, x, base, lanes, stepped

    # -- statements -----------------------------------------------------------------------

    def stmt(self, stmt: Stmt) -> None:
        match stmt:
            case Seq(stmts):
                for s in stmts:
                    self.stmt(s)
            case Block(name, body=body):
                with self.p.scope(f"{{  // block {name}" if name else "{"):
                    self.stmt(body)
            case IfThenElse(cond, _, _):
                if self.x in free_vars(cond):
                    raise Unvectorizable("a condition that depends on the lane")
                self.p.if_then_else(stmt, self.stmt)
            case BufferStore():
                self.store(stmt)
            case _:
                raise Unvectorizable(type(stmt).__name__)

    def store(self, stmt: BufferStore) -> None:
        buffer = stmt.buffer
        value = self.vector(self.value(stmt.value), buffer.dtype)
        ref = self.contiguous(buffer, stmt.indices)
        if ref is None:
            raise Unvectorizable("a store that is not unit-stride in the lane")
        kind, text = ref
        value = _unwrap(value)
        if kind == "register":
            self.p.emit(f"{text} = {value};")
        else:
            self.p.emit(
                f"{self.helper(kind.replace('load', 'store'), buffer.dtype)}({text}, {value});"
            )

    # -- memory ---------------------------------------------------------------------------

    def contiguous(self, buffer: Buffer, indices: tuple[Expr, ...]) -> tuple[str, str] | None:
        """How to reach the chunk's lanes of `buffer` at `indices`: ("register", element of a
        register array), ("loada" | "load", address); None unless unit-stride in x."""
        if buffer.dtype == "bool":
            raise Unvectorizable("bools in memory are bytes, not masks")
        p = self.p
        if buffer in p.registers:
            return self.register_ref(buffer, indices)
        flat = p.flat(buffer, indices)
        coeffs = affine_coefficients(flat, [self.x])
        if coeffs is None or coeffs[self.x] != 1:
            return None
        start = self.at_base(flat)
        aligned = buffer in p.allocated and self.multiple(start)
        return ("loada" if aligned else "load"), f"&{p.names(buffer, buffer.name)}[{p.bare(start)}]"

    def register_ref(self, buffer: Buffer, indices: tuple[Expr, ...]) -> tuple[str, str] | None:
        *outer, last = (simplify(i, self.p.ranges) for i in indices)
        if any(self.x in free_vars(i) for i in outer) or self.p.registers[buffer] != self.lanes:
            return None
        coeffs = affine_coefficients(last, [self.x])
        start = self.at_base(last)
        if coeffs is None or coeffs[self.x] != 1 or not self.multiple(start):
            return None
        chunk = simplify(Binary("floordiv", start, IntImm(self.lanes, start.dtype)), self.p.ranges)
        subscripts = "".join(f"[{self.p.bare(i)}]" for i in outer)
        return "register", f"{self.p.names(buffer, buffer.name)}{subscripts}[{self.p.bare(chunk)}]"

    def at_base(self, e: Expr) -> Expr:
        return simplify(substitute(e, {self.x: self.base}), self.p.ranges)  # type: ignore[arg-type]

    def multiple(self, e: Expr) -> bool:
        """Whether `e` is provably a multiple of the chunk: affine, every coefficient one."""
        if self.stepped:  # x runs over multiples of lanes: x = lanes * x'
            e = simplify(substitute(e, {self.x: self.x * IntImm(self.lanes)}))  # type: ignore[arg-type]
        vars = sorted(free_vars(e), key=lambda v: v.name)
        coeffs = affine_coefficients(e, vars)
        if coeffs is None:
            return False
        rebuilt: Expr = IntImm(coeffs[None], e.dtype)
        for v in vars:
            rebuilt = rebuilt + v * IntImm(coeffs[v], e.dtype)
        exact = simplify(Binary("-", e, rebuilt)) == IntImm(0, e.dtype)
        return exact and all(c % self.lanes == 0 for c in coeffs.values())

    def load(self, e: BufferLoad) -> VValue:
        ref = self.contiguous(e.buffer, e.indices)
        if ref is None:  # a gather: lane by lane
            lanes = [
                self.p.expr(substitute(e, {self.x: self.base + IntImm(i)}))  # type: ignore[arg-type]
                for i in range(self.lanes)
            ]
            return VValue(f"({self.vtype(e.dtype)}){{{', '.join(lanes)}}}", True, e.dtype)
        kind, text = ref
        text = text if kind == "register" else f"{self.helper(kind, e.dtype)}({text})"
        return VValue(text, True, e.dtype)

    # -- values ---------------------------------------------------------------------------

    def value(self, e: Expr) -> VValue:
        if self.x not in free_vars(e):
            return VValue(self.p.expr(e), False, e.dtype)
        match e:
            case Var():  # the lane var itself, as numbers
                iota = ", ".join(str(i) for i in range(self.lanes))
                text = f"({self.p.expr(self.base)} + ({self.vtype('int32')}){{{iota}}})"
                return VValue(text, True, "int32")
            case BufferLoad():
                return self.load(e)
            case Binary(op, a, b):
                return self.binary(op, a, b)
            case Unary(op, a):
                return self.unary(op, a)
            case Select(cond, then, else_):
                return self.select(cond, then, else_)
            case Cast(dtype, a):
                return self.cast(dtype, a)
            case Call("abs", (a,)):
                v = self.value(a)
                kind = "abs" if is_float(a.dtype) else "iabs"
                return VValue(f"{self.helper(kind, a.dtype)}({v.text})", True, a.dtype)
            case Call(name, (a,)) if self.p.vector_math and has_vector_form(name, a.dtype):
                v = self.vector(self.value(a), a.dtype)
                return VValue(f"{self.helper(name, a.dtype)}({v})", True, a.dtype)
        raise Unvectorizable(f"no vector form for {e!r}")

    def binary(self, op: str, a: Expr, b: Expr) -> VValue:
        x, y, dtype = self.value(a), self.value(b), a.dtype
        if op in COMPARE_OPS and dtype != "bool":
            return VValue(f"({x.text} {op} {y.text})", True, "bool", itemsize(dtype))
        if op in LOGIC_OPS:
            if not (x.vector and y.vector and x.mask_bytes == y.mask_bytes):
                raise Unvectorizable("masks of different widths")
            return VValue(
                f"({x.text} {'&' if op == '&&' else '|'} {y.text})", True, "bool", x.mask_bytes
            )
        if dtype == "bool":
            raise Unvectorizable("bool arithmetic")
        if op in ("+", "-", "*", "/"):
            return VValue(f"({x.text} {op} {y.text})", True, dtype)
        if op in BIT_OPERATORS:  # GCC's vector operators, lane by lane in the dtype
            return VValue(f"({x.text} {BIT_OPERATORS[op]} {y.text})", True, dtype)
        if op in ("floordiv", "floormod") and not is_float(dtype):
            if self.p.lower_bound(a) >= 0 and self.p.lower_bound(b) > 0:
                text = f"({x.text} {'/' if op == 'floordiv' else '%'} {y.text})"
                return VValue(text, True, dtype)
            op = f"i{op}"  # C's truncating / and %, corrected where the signs differ
        vector_pow = op == "pow" and self.p.vector_math and has_vector_form(op, dtype)
        if op in ("min", "max", "ifloordiv", "ifloormod") or vector_pow:
            text = f"{self.helper(op, dtype)}({self.vector(x, dtype)}, {self.vector(y, dtype)})"
            return VValue(text, True, dtype)
        raise Unvectorizable(f"no vector form for {op} on {dtype}")

    def unary(self, op: str, a: Expr) -> VValue:
        x = self.value(a)
        if op == "!" and x.mask_bytes:
            return VValue(f"(~{x.text})", True, "bool", x.mask_bytes)
        if op == "-" and a.dtype != "bool":
            return VValue(f"(-{x.text})", True, a.dtype)
        raise Unvectorizable(f"no vector form for {op} on {a.dtype}")

    def select(self, cond: Expr, then: Expr, else_: Expr) -> VValue:
        c, dtype = self.value(cond), then.dtype
        t, f = self.vector(self.value(then), dtype), self.vector(self.value(else_), dtype)
        if dtype == "bool":
            raise Unvectorizable("a select of bools")
        if not c.vector:
            return VValue(f"({c.text} ? {t} : {f})", True, dtype)
        if c.mask_bytes != itemsize(dtype):
            raise Unvectorizable("a mask of another width than the values it selects")
        return VValue(f"{self.helper('select', dtype)}({c.text}, {t}, {f})", True, dtype)

    def cast(self, dtype: str, a: Expr) -> VValue:
        x = self.value(a)
        if "bool" in (dtype, a.dtype):
            raise Unvectorizable("a cast from or to bool")
        if dtype == a.dtype:
            return x
        if {dtype, a.dtype} & set(BYTE_FLOATS):
            raise Unvectorizable("an 8-bit float's conversion (one element at a time)")
        if {dtype, a.dtype} & set(SUB_BYTE_INTS):
            raise Unvectorizable("a sub-byte int's conversion (one element at a time)")
        if "bfloat16" in (dtype, a.dtype):  # bits <-> float32 (c_narrow.py)
            kind = "narrow" if dtype == "bfloat16" else "widen"
            return VValue(f"{self.helper(kind, a.dtype)}({self.vector(x, a.dtype)})", True, dtype)
        text = x.text
        if a.dtype in ("int8", "uint8") and itemsize(dtype) == 4 and x.vector:
            text = f"{self.helper('widen_bytes', a.dtype)}({text})"  # int32 lanes
            if dtype == "int32":
                return VValue(text, True, dtype)
        if is_float(a.dtype) and not is_float(dtype) and itemsize(dtype) < 4:
            # through int32 (vcvttps2dq, then vpmovdb/vpmovdw): GCC converts floats to 8- and
            # 16-bit lanes one at a time (a quantization's uint8 store: 4x slower)
            text = f"__builtin_convertvector({text}, {self.vtype('int32')})"
        return VValue(f"__builtin_convertvector({text}, {self.vtype(dtype)})", True, dtype)

    # -- types and helpers ----------------------------------------------------------------

    def vector(self, v: VValue, dtype: str) -> str:
        """`v` as a vector: a scalar is splat across the lanes."""
        return v.text if v.vector else f"{self.helper('splat', dtype)}({v.text})"

    def vtype(self, dtype: str) -> str:
        return self.p.vector_type(dtype, self.lanes)

    def helper(self, kind: str, dtype: str) -> str:
        return self.p.vector_helper(kind, dtype, self.lanes)


class _LastChunk(_Chunk):
    """A chunk whose stores wait: each value into a temporary now, its store in `stores`."""

    def __init__(self, p: CPrinter, x: Var, base: Expr, lanes: int, stepped: bool):
        super().__init__(p, x, base, lanes, stepped)
        self.stores: list[str] = []

    def stmt(self, stmt: Stmt) -> None:
        match stmt:
            case Block(body=body):
                self.stmt(body)  # no scope: the temporaries outlive it
            case IfThenElse():
                raise Unvectorizable("a condition in a loop's last vector")
            case _:
                super().stmt(stmt)

    def store(self, stmt: BufferStore) -> None:
        buffer = stmt.buffer
        ref = self.contiguous(buffer, stmt.indices)
        if ref is None or ref[0] == "register":
            raise Unvectorizable("a last vector's store that is not to memory, unit-stride")
        value = _unwrap(self.vector(self.value(stmt.value), buffer.dtype))
        name = self.p.names(object(), "hx_last")
        self.p.emit(f"{self.vtype(buffer.dtype)} {name} = {value};")
        store = self.helper(ref[0].replace("load", "store"), buffer.dtype)
        self.stores.append(f"{store}({ref[1]}, {name});")


def _unwrap(text: str) -> str:
    """`text` without its outer parentheses, where they enclose it whole."""
    if not text.startswith("("):
        return text
    depth = 0
    for n, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return text[1:-1] if n == len(text) - 1 else text
    return text


# The vector helpers, emitted only when used: {v} the vector type, {m} its mask type (ints of
# the same width), {t} the element type, {n} the vector's bytes, {splat} `s` once per lane,
# {absmask} the largest integer of the mask's element type.
VECTOR_HELPERS: dict[str, str] = {
    "load": (
        "{q} {v} hx_load_{sv}(const {t}* p) {{\n"
        "  {v} r; __builtin_memcpy(&r, p, {n}); return r;\n}}"
    ),
    "loada": (
        "{q} {v} hx_loada_{sv}(const {t}* p) {{\n"
        "  {v} r; __builtin_memcpy(&r, __builtin_assume_aligned(p, {n}), {n}); return r;\n}}"
    ),
    "store": "{q} void hx_store_{sv}({t}* p, {v} x) {{ __builtin_memcpy(p, &x, {n}); }}",
    "storea": (
        "{q} void hx_storea_{sv}({t}* p, {v} x) {{\n"
        "  __builtin_memcpy(__builtin_assume_aligned(p, {n}), &x, {n});\n}}"
    ),
    "splat": "{q} {v} hx_splat_{sv}({t} s) {{ return ({v}){{{splat}}}; }}",
    "select": (
        "{q} {v} hx_select_{sv}({m} c, {v} a, {v} b) {{\n"
        "  return ({v})((({m})a & c) | (({m})b & ~c));\n}}"
    ),
    # The scalar helpers' NaN behaviour: `a < b ? a : b`.
    "min": "{q} {v} hx_min_{sv}({v} a, {v} b) {{ return hx_select_{sv}(a < b, a, b); }}",
    "max": "{q} {v} hx_max_{sv}({v} a, {v} b) {{ return hx_select_{sv}(a > b, a, b); }}",
    # Clearing the sign bit, so abs(-0.0) is 0.0 as in numpy.
    "abs": "{q} {v} hx_abs_{sv}({v} a) {{ return ({v})(({m})a & {absmask}); }}",
    "iabs": "{q} {v} hx_iabs_{sv}({v} a) {{ return hx_select_{sv}(a < 0, -a, a); }}",
    # As the scalar helpers: a true mask is -1, so adding it subtracts one.
    "ifloordiv": (
        "{q} {v} hx_ifloordiv_{sv}({v} a, {v} b) {{\n"
        "  {v} q = a / b, r = a % b;\n"
        "  return q + ((r != 0) & ((r < 0) != (b < 0)));\n}}"
    ),
    "ifloormod": (
        "{q} {v} hx_ifloormod_{sv}({v} a, {v} b) {{\n"
        "  {v} r = a % b;\n"
        "  return r + (((r != 0) & ((r < 0) != (b < 0))) & b);\n}}"
    ),
}
# Helpers that are one x86 instruction where the target has it, by (kind, vector bytes): the
# features that have it and the intrinsic's name before its `_ps`/`_pd`. x86's MINPS/MAXPS
# return the second operand unless the first compares less (greater), exactly the portable
# min/max helpers, NaNs and signed zeros included (the compare-and-blend they replace is three
# instructions on a reduction's dependency chain). VSCALEFPS is exp's a·2^b in one instruction
# where the portable scale2 (c_math.py) takes nine, with the same single rounding.
X86_INTRINSICS: dict[tuple[str, int], tuple[tuple[str, ...], str]] = {
    ("min", 32): (("avx", "avx2"), "_mm256_min"),
    ("max", 32): (("avx", "avx2"), "_mm256_max"),
    ("min", 64): (("avx512f",), "_mm512_min"),
    ("max", 64): (("avx512f",), "_mm512_max"),
    ("scale2", 64): (("avx512f",), "_mm512_scalef"),
}


def x86_intrinsic(kind: str, dtype: str, nbytes: int, features: tuple[str, ...]) -> str | None:
    """The body of the two-operand helper `kind` as an x86 intrinsic where the features have
    one for a vector of `nbytes` bytes of `dtype`, else None."""
    suffix = {"float32": "ps", "float64": "pd"}.get(dtype)
    needs, name = X86_INTRINSICS.get((kind, nbytes), ((), ""))
    if suffix is None or not any(f in features for f in needs):
        return None
    return f"{name}_{suffix}(a, b)"


INTRINSIC_HELPER = "{q} {v} hx_{kind}_{sv}({v} a, {v} b) {{ return {intrinsic}; }}"


# Helpers a helper calls, registered first so the C sees them declared.
HELPER_NEEDS: dict[str, tuple[str, ...]] = {
    "min": ("select",),
    "max": ("select",),
    "iabs": ("select",),
    "hmax": ("max",),
    "hmin": ("min",),
}

BodyPrinter = Callable[[Stmt], None]
