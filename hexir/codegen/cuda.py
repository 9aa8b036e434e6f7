"""CUDA C for a GPU-scheduled PrimFunc: one `extern "C" __global__` kernel.

    cuda = generate_cuda(func, Target("cuda -arch=sm_90"))
    cuda.source, cuda.name, cuda.grid, cuda.block

The printer is the C printer (c.py) with CUDA's target data: `blockIdx`/`threadIdx` loops are
the block's and thread's indices (no loop), `shared` buffers `__shared__` arrays declared at
the top of the kernel, per-thread buffers arrays that unrolled code indexes with constants
(registers), barriers `__syncthreads()`, `vectorized` loops `float2`/`float4` loads and stores
where every access of the lanes is contiguous and aligned (else a `#pragma unroll` loop), and
a reduction over threadIdx.x a warp-shuffle all-reduce (cuda_reduce.py). A stage that binds
fewer thread axes than the block has runs on the threads whose other indices are 0. The
lowering before printing is in cuda_lower.py, the launch shape and limits in gpu_verify.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexir.codegen.c import CPrinter
from hexir.codegen.c_names import C_KEYWORDS, LIBRARY_NAMES, Names, kernel_symbol
from hexir.codegen.cuda_lower import lower_for_cuda
from hexir.codegen.cuda_mma import emit_mma, mma_lane
from hexir.codegen.cuda_reduce import AllReduce
from hexir.codegen.gpu_verify import BLOCK_AXES, THREAD_AXES, Launch, verify_gpu
from hexir.errors import ResourceError, ScheduleError, TargetError
from hexir.ir.arith import affine_coefficients, simplify
from hexir.ir.dtype import SUB_BYTE_INTS, is_float, is_unsigned, itemsize, short_name
from hexir.ir.narrow import BYTE_FLOATS, HALF_FLOATS
from hexir.ir.tir import (
    AUTO_UNROLL_KEY,
    Allocate,
    Barrier,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Expr,
    For,
    IntImm,
    PrimFunc,
    Stmt,
    Var,
)
from hexir.ir.visit import free_vars, substitute, walk
from hexir.schedule.compact import compact_buffers
from hexir.schedule.reduction import identity
from hexir.schedule.tensorize import INTRINSICS, TENSORIZE, WarpMma

if TYPE_CHECKING:
    from hexir.runtime.target import Target

CUDA_NAMES = frozenset(
    "threadIdx blockIdx blockDim gridDim warpSize float2 float4 int2 int4 uint2 uint4 min max "
    "rsqrtf "
    "rsqrt __expf __logf __sinf __cosf __syncthreads __shfl_xor_sync __int_as_float "
    "INT32_MIN INT64_MIN INT64_C UINT32_C UINT64_C".split()
)
# NVRTC has no standard headers: what the C printer's output relies on, spelled for CUDA.
PREAMBLE = (
    "#define INFINITY __int_as_float(0x7f800000)",
    "#define NAN __int_as_float(0x7fffffff)",
    "#define INT32_MIN (-2147483647 - 1)",
    "#define INT64_MIN (-9223372036854775807LL - 1)",
    "#define INT64_C(x) x##LL",
    "#define UINT32_C(x) x##U",
    "#define UINT64_C(x) x##ULL",
)
# NVRTC has no <stdint.h>: the integer types by their C names.
CUDA_INTS = {
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "bfloat16": "unsigned short",  # its bits (c_narrow.py)
    "float16": "unsigned short",  # its bits, converted by PTX's cvt
    **dict.fromkeys(BYTE_FLOATS, "unsigned char"),  # their bits (c.py's float8_helpers)
    **{d: "unsigned char" if is_unsigned(d) else "signed char" for d in SUB_BYTE_INTS},
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
}
# float16's conversions through PTX's cvt (round to nearest even): CPrinter.cast's table.
F16_HELPERS = {
    "f32_f16": (
        "{q} unsigned short hx_f32_f16(float x) {{\n"
        '  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h;\n}}'
    ),
    "f16_f32": (
        "{q} float hx_f16_f32(unsigned short h) {{\n"
        '  float x; asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h)); return x;\n}}'
    ),
}
FAST_MATH = {"exp": "__expf", "log": "__logf", "sin": "__sinf", "cos": "__cosf"}
MAX_VECTOR_CHUNKS = 4


@dataclass(frozen=True)
class CudaSource:
    """A kernel's CUDA C and how to launch it."""

    source: str
    name: str  # the extern "C" symbol
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0  # dynamic shared memory to launch with: 0, it is all static today
    static_shared_bytes: int = 0  # the __shared__ arrays, reduction scratch included


def generate_cuda(
    func: PrimFunc, target: Target | str | None = None, *, fast_math: bool = False
) -> CudaSource:
    """The CUDA C kernel of GPU-scheduled `func` (caches compacted first), after checking its
    launch shape and shared memory against `target` (default: "cuda"). `fast_math` spells
    exp/log/sin/cos as their fast intrinsics (`__expf`), as nvcc's --use_fast_math does."""
    from hexir.runtime.target import Target

    target = Target.of(target if target is not None else "cuda")
    if target.kind != "cuda":
        raise TargetError(f"generate_cuda needs a CUDA target, got {str(target)!r}")
    func = compact_buffers(func)
    launch = verify_gpu(func, target)
    printer = CudaPrinter(target, launch, fast_math=fast_math)
    text = printer.print_func(func)
    limit = target.max_shared_memory_per_block
    if limit is not None and printer.shared_bytes > limit:
        raise ResourceError(
            f"kernel {func.name!r} needs {printer.shared_bytes} bytes of static shared memory "
            f"with its reduction scratch, over the limit of {limit} bytes of target {target}"
        )
    return CudaSource(text, kernel_symbol(func), launch.grid, launch.block, 0, printer.shared_bytes)


class CudaPrinter(CPrinter):
    """The C printer with CUDA's spelling of types, qualifiers, loops, memory and math."""

    includes: tuple[str, ...] = ()
    export = 'extern "C" __global__'
    restrict = "__restrict__"
    helper_qualifier = "static __device__ __forceinline__"
    conversions = {**CPrinter.conversions, **F16_HELPERS}

    def __init__(self, target: Target | None, launch: Launch, *, fast_math: bool = False):
        super().__init__(target)
        self.vector_bytes = 16
        self.launch = launch
        self.fast_math = fast_math
        self.shared_bytes = 0
        self.active: set[str] = set()  # axes bound (or guarded to 0) around what is printed
        self.guarded = False  # inside a guard that only some threads pass
        self.read_only: set[Buffer] = set()
        self._shared_decls: dict[object, str] = {}
        self._lanes: dict[BufferLoad, str] = {}
        self._temps = itertools.count()
        self.axis_vars: dict[str, tuple[Var, int]] = {}  # the thread loops around: var, extent
        # Tensor-core fragments loaded in this straight-line run: (operand, address) -> name.
        self.fragments: dict[tuple[str, str], str] = {}

    @contextmanager
    def scope(self, opener: str, closer: str = "}") -> Iterator[None]:
        self.fragments = {}  # what was loaded before a loop or branch may be stale in it
        with super().scope(opener, closer):
            yield
        self.fragments = {}

    # -- the kernel -----------------------------------------------------------------------

    def print_func(self, func: PrimFunc) -> str:
        symbol = kernel_symbol(func)
        self.names = Names(C_KEYWORDS | LIBRARY_NAMES | CUDA_NAMES | {symbol})
        body = lower_for_cuda(func.body, self.launch)
        self.registers = {}  # unrolled constant indices keep per-thread arrays in registers
        written = {n.buffer for n in walk(body) if isinstance(n, BufferStore)}
        self.read_only = {b for b in func.params if b not in written}
        with self.scope(self.func_signature(func, symbol) + " {"):
            start = len(self._lines)
            self.stmt_list(body)
        self._lines[start - 1] = self.func_signature(func, symbol) + " {"  # knows the body now
        decls = [self.indent_unit + d for d in self._shared_decls.values()]
        self._lines[start:start] = decls
        return "\n".join([*self.preamble(), "", *self._lines]) + "\n"

    def func_signature(self, func: PrimFunc, symbol: str) -> str:
        params = ", ".join(
            f"{'const ' if b in self.read_only else ''}{self.ctype(b.dtype)}* {self.restrict} "
            f"{self.names(b, b.name)}"
            for b in func.params
        )
        # A tensor-core kernel says one block a multiprocessor is enough: ptxas otherwise
        # aims at more and caps the registers below a warp tile's accumulators and fragments
        # (a 32 x 64 tile spilled 12 bytes at 48 registers; with the hint, 60 and none).
        tensor = any(name.startswith("hx_mma_") for name in self._helpers)
        bounds = f"__launch_bounds__({self.launch.threads}{', 1' if tensor else ''})"
        return f"{self.export} void {bounds} {symbol}({params or 'void'})"

    def preamble(self) -> list[str]:
        grid, block = self.launch.grid, self.launch.block
        head = f"// grid {grid}, block {block}, {self.shared_bytes} bytes of shared memory"
        return [head, *PREAMBLE, *self._helpers.values()]

    def ctype(self, dtype: str) -> str:
        return CUDA_INTS.get(dtype) or super().ctype(dtype)

    # -- statements -----------------------------------------------------------------------

    def stmt(self, stmt: Stmt) -> None:
        if not (isinstance(stmt, For) and TENSORIZE in dict(stmt.annotations)):
            self.fragments = {}  # it may store to what a fragment holds
        missing = [
            a
            for a in (*THREAD_AXES, *BLOCK_AXES)
            if self.launch.dim(a) > 1 and a not in self.active
        ]
        if missing and _is_work(stmt):
            # A stage bound to fewer axes than the block has: once, on the index-0 threads.
            cond = " && ".join(f"{a} == 0" for a in missing)
            with self.scope(f"if ({cond}) {{"), self.on_axes(missing, guarded=True):
                self.stmt(stmt)
            return
        if isinstance(stmt, AllReduce):
            self.all_reduce(stmt.buffer, stmt.op)
        else:
            super().stmt(stmt)

    @contextmanager
    def on_axes(self, axes: list[str], guarded: bool = False) -> Iterator[None]:
        saved = (set(self.active), self.guarded)
        self.active.update(axes)
        self.guarded = self.guarded or guarded
        try:
            yield
        finally:
            self.active, self.guarded = saved

    def loop(self, loop: For) -> None:
        intrinsic = dict(loop.annotations).get(TENSORIZE)
        if isinstance(intrinsic, str) and self.tensorized(loop, intrinsic):
            return
        if loop.kind in THREAD_AXES or loop.kind in BLOCK_AXES:
            v = self.var(loop.var)
            saved = self._unroll_step
            outer = dict(self.axis_vars)
            self.axis_vars[loop.kind] = (loop.var, loop.extent)
            step = dict(loop.annotations).get(AUTO_UNROLL_KEY)  # the search's unroll, kept on
            if isinstance(step, int) and not isinstance(step, bool):  # the block loop
                self._unroll_step = step
            with self.scope(f"{{  // {loop.kind}"), self.bind_ranges({loop.var: loop.extent}):
                if loop.var in free_vars(loop.body):
                    self.emit(f"const int {v} = (int){loop.kind};")
                with self.on_axes([loop.kind]):
                    self.stmt_list(loop.body)
            self._unroll_step, self.axis_vars = saved, outer
            return
        if loop.kind == "vectorized" and self.vector_loop(loop):
            return
        self.scalar_loop(loop)

    def tensorized(self, loop: For, intrinsic: str) -> bool:
        known = INTRINSICS.get(intrinsic)
        return isinstance(known, WarpMma) and emit_mma(self, loop, known, mma_lane(self.axis_vars))

    def loop_pragmas(self, loop: For) -> list[str]:
        unrolls = loop.kind in ("unrolled", "vectorized") or self.auto_unrolls(loop)
        return ["#pragma unroll"] if unrolls else []

    def allocate(self, buffer: Buffer) -> list[str]:
        t, name = self.ctype(buffer.dtype), self.names(buffer, buffer.name)
        size = max(buffer.size, 1)
        if buffer.scope == "shared":
            self.declare_shared(buffer, f"__shared__ __align__(16) {t} {name}[{size}];", size)
        else:
            self.emit(f"{t} {name}[{size}];")
        return []

    def declare_shared(self, key: object, decl: str, size: int) -> None:
        if key not in self._shared_decls:
            self._shared_decls[key] = decl
            self.shared_bytes += size * itemsize(getattr(key, "dtype", "float32"))

    def barrier(self) -> None:
        self.fragments = {}
        self.emit("__syncthreads();")

    # -- vector loads and stores ----------------------------------------------------------

    def vector_loop(self, loop: For) -> bool:
        """`loop` as float2/float4 accesses, when its body is one float32 store contiguous
        and aligned in the lane (loads too, or invariant, or loaded lane by lane); a copy of
        16-bit elements (a float16 tile into shared memory) as 4-, 8- or 16-byte words."""
        store = _single_store(loop.body)
        if store is None:
            return False
        if store.buffer.dtype == "float32":
            lanes = 4 if loop.extent % 4 == 0 else 2
        elif itemsize(store.buffer.dtype) == 2 and _copies(store):
            lanes = next((n for n in (8, 4, 2) if loop.extent % n == 0), 1)
        else:
            return False
        if loop.extent % lanes or lanes == 1 or loop.extent // lanes > MAX_VECTOR_CHUNKS:
            return False
        x = loop.var
        with self.bind_ranges({x: loop.extent}):
            bases = [IntImm(c * lanes) for c in range(loop.extent // lanes)]
            if any(self.vector_ref(store, x, b, lanes) is None for b in bases):
                return False
            vt = _vector_type(store.buffer.dtype, lanes)
            with self.scope(f"{{  // {loop.kind} {self.var(x)}: {vt}"):
                for base in bases:
                    self.vector_chunk(store, x, base, lanes)
        return True

    def vector_ref(self, access: BufferLoad | BufferStore, x: Var, base: Expr, lanes: int):
        """`&buf[start]` for the lanes base .. base + lanes - 1 of `access`, or None unless
        they are contiguous, start aligned, in a buffer that is not per-thread."""
        buffer = access.buffer
        if buffer.scope == "local" or buffer.dtype not in ("float32", *HALF_FLOATS):
            return None
        flat = self.flat(buffer, access.indices)
        coeffs = affine_coefficients(flat, [x], self.ranges)
        if coeffs is None or coeffs[x] != 1:
            return None
        start = simplify(substitute(flat, {x: base}), self.ranges)  # type: ignore[arg-type]
        aligned = simplify(start % IntImm(lanes, start.dtype), self.ranges)
        if aligned != IntImm(0, start.dtype) and not _multiple(start, lanes):
            return None
        return f"&{self.names(buffer, buffer.name)}[{self.bare(start)}]"

    def vector_chunk(self, store: BufferStore, x: Var, base: Expr, lanes: int) -> None:
        vt, fields = _vector_type(store.buffer.dtype, lanes), "xyzw"[:lanes]
        dst = self.vector_ref(store, x, base, lanes)
        value = store.value
        src = self.vector_ref(value, x, base, lanes) if isinstance(value, BufferLoad) else None
        if src is not None:  # a copy: one vector load, one vector store
            self.emit(f"*reinterpret_cast<{vt}*>({dst}) = *reinterpret_cast<const {vt}*>({src});")
            return
        loads = {n for n in walk(store.value) if isinstance(n, BufferLoad) and x in free_vars(n)}
        for load in sorted(loads, key=str):
            ref = self.vector_ref(load, x, base, lanes)
            if ref is None:
                continue  # loaded lane by lane
            tmp = self.names(("vec", next(self._temps)), "vec")
            self.emit(f"const {vt} {tmp} = *reinterpret_cast<const {vt}*>({ref});")
            for n, f in enumerate(fields):
                self._lanes[substitute(load, {x: base + IntImm(n)})] = f"{tmp}.{f}"  # type: ignore[index]
        out = self.names(("vec", next(self._temps)), "vec")
        self.emit(f"{vt} {out};")
        for n, f in enumerate(fields):
            lane = substitute(store.value, {x: base + IntImm(n)})
            self.emit(f"{out}.{f} = {self.bare(lane)};")  # type: ignore[arg-type]
        self._lanes.clear()
        self.emit(f"*reinterpret_cast<{vt}*>({dst}) = {out};")

    def expr(self, e: Expr) -> str:
        if self._lanes and isinstance(e, BufferLoad) and e in self._lanes:
            return self._lanes[e]
        return super().expr(e)

    # -- math -----------------------------------------------------------------------------

    def call(self, name: str, arg: Expr) -> str:
        if not is_float(arg.dtype):
            return super().call(name, arg)
        f32 = arg.dtype == "float32"
        if name == "rsqrt":
            return f"rsqrt{'f' if f32 else ''}({self.expr(arg)})"
        if self.fast_math and f32 and name in FAST_MATH:
            return f"{FAST_MATH[name]}({self.expr(arg)})"
        if self.fast_math and f32 and name == "sigmoid":
            one = self.float_literal(1.0, arg.dtype)
            return f"({one} / ({one} + __expf(-{self.expr(arg)})))"
        return super().call(name, arg)

    # -- cross-thread reduction -----------------------------------------------------------

    def all_reduce(self, buffer: Buffer, op: str) -> None:
        """Every thread's `buffer[0]` combined across its threadIdx.x row, in every thread."""
        width, threads = self.launch.block[0], self.launch.threads
        if self.guarded:
            raise ScheduleError(
                "a cross-thread reduction sits in a stage bound to fewer thread axes than the "
                "block has, so not every thread reaches it: bind the stage's loops to every "
                "thread axis of the block",
                "generate_cuda",
            )
        if not (width <= 32 and width & (width - 1) == 0) and width % 32:
            raise ScheduleError(
                f"a cross-thread reduction over threadIdx.x of extent {width}: the extent must "
                "be a power of two up to 32 or a multiple of 32",
                "generate_cuda",
            )
        t, dtype = self.ctype(buffer.dtype), buffer.dtype
        acc = self.access(buffer, (IntImm(0),))
        r = self.names(("red", next(self._temps)), "red")
        with self.scope(f"{{  // all-reduce ({op}) over threadIdx.x"):
            self.emit(f"{t} {r} = {acc};")
            mask = "0xffffffffu" if threads % 32 == 0 else self.warp_mask(threads)
            self.shuffle(r, op, dtype, min(width, 32), mask)
            if width > 32:
                self.across_warps(r, op, dtype, width // 32)
            self.emit(f"{acc} = {r};")

    def warp_mask(self, threads: int) -> str:
        """The lanes of this thread's warp that exist (the block's last warp is partial)."""
        tid = "(int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))"
        left = self.names(("left", next(self._temps)), "lanes")
        self.emit(f"const int {left} = {threads} - ({tid} & ~31);")
        return f"({left} >= 32 ? 0xffffffffu : (1u << {left}) - 1u)"

    def shuffle(self, r: str, op: str, dtype: str, width: int, mask: str) -> None:
        o = self.names(("off", next(self._temps)), "offset")
        other = f"__shfl_xor_sync({mask}, {r}, {o}, {width})"
        self.emit("#pragma unroll")
        with self.scope(f"for (int {o} = {width // 2}; {o} > 0; {o} >>= 1) {{"):
            self.emit(f"{r} = {self.combine(op, dtype, r, other)};")

    def across_warps(self, r: str, op: str, dtype: str, warps: int) -> None:
        groups = self.launch.block[1] * self.launch.block[2]
        scratch = self.names(("scratch", dtype), f"red_scratch_{short_name(dtype)}")
        t = self.ctype(dtype)
        self.declare_shared(
            ("scratch", dtype), f"__shared__ {t} {scratch}[{groups * warps}];", groups * warps
        )
        slot = f"(threadIdx.y + {self.launch.block[1]} * threadIdx.z) * {warps}"
        lane, warp = "(threadIdx.x & 31)", "(threadIdx.x >> 5)"
        self.emit(f"if ({lane} == 0) {scratch}[{slot} + {warp}] = {r};")
        self.emit("__syncthreads();")
        none = self.expr(identity(op, dtype))
        self.emit(f"{r} = {lane} < {warps} ? {scratch}[{slot} + {lane}] : {none};")
        self.shuffle(r, op, dtype, 32, "0xffffffffu")
        self.emit("__syncthreads();")  # the scratch is free for the next reduction

    def combine(self, op: str, dtype: str, a: str, b: str) -> str:
        if op in ("max", "min"):
            return f"{self.helper(op, dtype)}({a}, {b})"
        return f"{a} {op} {b}"


def _is_work(stmt: Stmt) -> bool:
    """Whether `stmt` computes something and holds no bound loop (a stage of its own)."""
    if isinstance(stmt, (Allocate, Barrier)):
        return False
    return not any(
        isinstance(n, For) and (n.kind in THREAD_AXES or n.kind in BLOCK_AXES) for n in walk(stmt)
    )


def _single_store(stmt: Stmt) -> BufferStore | None:
    match stmt:
        case BufferStore():
            return stmt
        case Block(body=body):
            return _single_store(body)
    return None


def _vector_type(dtype: str, lanes: int) -> str:
    """The CUDA vector type of `lanes` elements: float2/float4, or 16-bit elements as words."""
    return f"float{lanes}" if dtype == "float32" else {2: "unsigned", 4: "uint2", 8: "uint4"}[lanes]


def _copies(store: BufferStore) -> bool:
    return isinstance(store.value, BufferLoad) and store.value.buffer.dtype == store.buffer.dtype


def _multiple(e: Expr, lanes: int) -> bool:
    """Whether `e` is provably a multiple of `lanes`: affine with every coefficient one."""
    vars = sorted(free_vars(e), key=lambda v: v.name)
    coeffs = affine_coefficients(e, vars)
    if coeffs is None:
        return False
    rebuilt: Expr = IntImm(coeffs[None], e.dtype)
    for v in vars:
        rebuilt = rebuilt + v * IntImm(coeffs[v], e.dtype)
    exact = simplify(e - rebuilt) == IntImm(0, e.dtype)
    return exact and all(c % lanes == 0 for c in coeffs.values())


__all__ = ["CudaPrinter", "CudaSource", "generate_cuda"]
