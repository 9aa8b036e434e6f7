"""A static reading of a CUDA kernel, no GPU needed: shared-memory bank conflicts, occupancy,
and the fraction of FP32 peak its innermost loop's issue mix allows.

    report = analyze(kernel)        # a CudaKernel: hexir.build(func, "cuda -arch=sm_90")
    reading = read_schedule(func, target)   # before a build: conflicts and issue mix only
    report.accesses                 # each shared access: wavefronts per warp request vs ideal
    report.conflict_free            # no access needs more wavefronts than its width
    report.occupancy                # resident warps per multiprocessor / the most it holds
    report.predicted                # fraction of FP32 peak the inner loop's issue mix allows
    print(report)                   # one line

The model (documented, not measured):
- A shared access is evaluated for the first warp (lanes 0..31, threadIdx.x fastest), every
  other loop at its first iteration. Shared memory has 32 banks of 4 bytes; a request takes as
  many wavefronts as the most distinct words any bank is asked for (lanes reading one word
  share it). A lane reading 8 or 16 bytes (a vectorized loop) splits the warp into phases of
  16 or 8 lanes, each phase its own wavefronts: conflict-free, a float4 request takes 4.
- Occupancy: blocks per multiprocessor limited by registers (allocated per warp in units of
  256), shared memory (static plus dynamic plus 1 KB the driver reserves per block), threads
  and blocks per multiprocessor of the arch.
- Predicted peak: in one iteration of the innermost loop that is not unrolled around the
  contraction's update (its unrolled loops enumerated: `unroll`ed ones, and serial ones the
  printer unrolls under an enclosing `pragma_auto_unroll_max_step`), FMAs per warp take
  FMAs / 4 clocks of a multiprocessor (128 FP32 lanes), the distinct loads take their
  wavefronts at one a clock (a shared load its banks' wavefronts, a global one, through L1,
  a wavefront per 128-byte line); unrolled loads of consecutive words, aligned, count as one
  vector load (ptxas emits LDS.64/LDS.128 for them). Predicted = FMA clocks / max(FMA clocks,
  memory clocks). L2 and DRAM bandwidth and latency are left out: a ceiling of the issue
  mix, not a time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hexir.codegen.c import auto_unrolled
from hexir.codegen.cuda_mma import ldsm_kind, ldsm_rows
from hexir.codegen.gpu_verify import launch_shape
from hexir.ir import arith
from hexir.ir.arith_eval import evaluate
from hexir.ir.dtype import numpy_dtype
from hexir.ir.tir import (
    AUTO_UNROLL_KEY,
    Binary,
    Block,
    Buffer,
    BufferLoad,
    BufferStore,
    Expr,
    For,
    PrimFunc,
    Var,
)
from hexir.ir.visit import substitute, walk
from hexir.runtime.cuda_kernel import CudaKernel
from hexir.runtime.target import Target
from hexir.schedule.common import sub_stmts
from hexir.schedule.compact import compact_buffers
from hexir.schedule.tensorize import INTRINSICS, TENSORIZE, MmaMatch, WarpMma, match_mma

BANKS = 32
WARP = 32
FMA_LANES_PER_CLOCK = 128  # FP32 lanes of one multiprocessor (sm_80's are 64: see LIMITS)
RESERVED_SHARED = 1024  # bytes per block the driver keeps (sm_80 and later)
REGISTER_UNIT = 256  # registers are allocated per warp in units of this many
MMA_FMAS = 16 * 8 * 16  # multiply-adds of one m16n8k16
# Dense float16/bfloat16 tensor multiply-adds per clock of a multiprocessor (NVIDIA's peak
# tables: A100 312 TFLOPS over 108 SMs at 1.41 GHz; H100 989 over 132 at 1.83). On sm_90 that
# rate is wgmma's; mma.sync issues at a lower one that the model does not know.
TENSOR_FMAS_PER_CLOCK = {"sm_80": 1024, "sm_86": 512, "sm_89": 512, "sm_90": 2048}

# Per arch: (shared memory per multiprocessor, threads, blocks, FP32 lanes), NVIDIA's tables.
LIMITS = {
    "sm_80": (164 * 1024, 2048, 32, 64),
    "sm_86": (100 * 1024, 1536, 16, 128),
    "sm_89": (100 * 1024, 1536, 24, 128),
    "sm_90": (228 * 1024, 2048, 32, 128),
}
REGISTERS_PER_SM = 65536


@dataclass(frozen=True)
class Access:
    """One shared-memory access of the kernel, read for the first warp."""

    buffer: str
    kind: str  # "load" or "store"
    width: int  # words per lane (1, 2 or 4)
    wavefronts: int  # per warp request
    ideal: int  # without conflicts: one per phase

    @property
    def degree(self) -> float:
        return self.wavefronts / self.ideal


@dataclass(frozen=True)
class Reading:
    """What the schedule alone decides: its shared accesses and its inner loop's issue mix."""

    accesses: tuple[Access, ...]
    fma_clocks: float  # per warp, one iteration of the innermost rolled loop
    memory_clocks: float  # shared wavefronts and L1 lines, same iteration
    predicted: float  # FMA clocks / max(FMA clocks, shared clocks): a ceiling
    tensor_cores: bool  # the clocks and the ceiling are the tensor cores' (mma.sync)

    @property
    def conflict_free(self) -> bool:
        return all(a.wavefronts <= a.ideal for a in self.accesses)

    @property
    def worst(self) -> float:
        return max((a.degree for a in self.accesses), default=1.0)


@dataclass(frozen=True)
class Report(Reading):
    """A Reading of a built kernel, with what the build decides: registers and occupancy."""

    kernel: str
    registers: int
    spill_bytes: int
    blocks_per_sm: int
    occupancy: float  # resident warps / the most a multiprocessor holds

    def __str__(self) -> str:
        return (
            f"{self.kernel}: {len(self.accesses)} shared accesses, worst conflict "
            f"{self.worst:.0f}-way; {self.registers} registers, {self.spill_bytes} B spilled; "
            f"{self.blocks_per_sm} blocks/SM, occupancy {self.occupancy:.0%}; "
            f"issue mix allows {self.predicted:.0%} of "
            f"{'tensor-core' if self.tensor_cores else 'FP32'} peak"
        )


def analyze(kernel: CudaKernel) -> Report:
    """The static reading of a built CUDA kernel (see the module docstring)."""
    reading = _read(compact_buffers(kernel.func), kernel.block, kernel.binary.arch)
    blocks, occupancy = _occupancy(kernel)
    return Report(
        **vars(reading),
        kernel=kernel.name,
        registers=kernel.resources.get("registers", 0),
        spill_bytes=kernel.resources.get("spill_bytes", 0),
        blocks_per_sm=blocks,
        occupancy=occupancy,
    )


def read_schedule(func: PrimFunc, target: Target) -> Reading:
    """What a scheduled `func` says before it is built (the cost model's GPU columns): its
    shared accesses' conflicts and its inner loop's issue mix, for the launch its thread
    bindings describe on `target`'s arch. Registers and occupancy need the build (`analyze`)."""
    func = compact_buffers(func)
    return _read(func, launch_shape(func).block, target.arch)


def _read(func: PrimFunc, block: tuple[int, ...], arch: str) -> Reading:
    threads = _thread_vars(func.body)
    lanes = [_lane(n, block) for n in range(min(WARP, math.prod(block)))]
    mma = _mma_mix(func.body, threads, lanes, arch)
    fma, memory, inner = mma or _issue_mix(func.body, threads, lanes)
    accesses = [  # the update's loads as the inner loop issues them (merged into vectors)
        _access(indices, node, loops, threads, lanes)
        for indices, node, loops in _shared_accesses(func.body, [])
        if node not in inner
    ]
    return Reading(
        tuple(a for a in [*accesses, *inner.values()] if a is not None),
        fma,
        memory,
        fma / max(fma, memory) if fma else 0.0,
        mma is not None,
    )


# ---------------------------------------------------------------------------------------------
# Shared accesses and their wavefronts


def _thread_vars(body) -> dict[Var, str]:  # noqa: ANN001 - any statement
    return {
        n.var: n.kind for n in walk(body) if isinstance(n, For) and n.kind.startswith("threadIdx")
    }


def _lane(n: int, block: tuple[int, int, int]) -> dict[str, int]:
    x, y, z = block
    return {"threadIdx.x": n % x, "threadIdx.y": n // x % y, "threadIdx.z": n // (x * y) % z}


def _shared_accesses(stmt, loops: list[For], bound: dict | None = None):  # noqa: ANN001, ANN202
    """(indices of a shared access in loop vars, its BufferLoad or BufferStore, the loops
    around it, outermost first): a block's iter vars replaced by their bindings."""
    bound = bound or {}
    if isinstance(stmt, For):
        yield from _shared_accesses(stmt.body, [*loops, stmt], bound)
        return
    if isinstance(stmt, Block):
        bound = bound | {iv.var: substitute(iv.binding, bound) for iv in stmt.iter_vars}
    if isinstance(stmt, BufferStore):
        nodes = [stmt] + [n for e in (stmt.value, *stmt.indices) for n in walk(e)]
        for n in nodes:
            if isinstance(n, (BufferLoad, BufferStore)) and n.buffer.scope == "shared":
                yield tuple(substitute(i, bound) for i in n.indices), n, loops
        return
    for child in sub_stmts(stmt):
        yield from _shared_accesses(child, loops, bound)


class _Zeros(dict):
    """An environment in which every var it does not name is 0 (its loop's first iteration)."""

    def __missing__(self, var: Var) -> int:
        return 0


def _value(expr: Expr, env: dict[Var, int]) -> int | None:
    """`expr`'s integer value, other vars at 0; None where it reads memory (a gathered index)."""
    try:
        value = evaluate(expr, _Zeros(env))
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _access(
    indices: tuple[Expr, ...],
    node: BufferLoad | BufferStore,
    loops: list[For],
    threads: dict[Var, str],
    lanes: list[dict[str, int]],
) -> Access | None:
    """The access `node` (its `indices` in loop vars) for the first warp's lanes."""
    buffer = node.buffer
    words = max(_itemsize(buffer) // 4, 1)
    vector = [lp for lp in loops if lp.kind == "vectorized"]
    width = (vector[-1].extent if vector else 1) * words
    flat = arith.flat_index(buffer, indices)
    addresses = []
    for lane in lanes:
        env = {v: lane[kind] for v, kind in threads.items()}
        value = _value(flat, env)
        if value is None:
            return None
        addresses.append(value * words)
    wavefronts, ideal = _wavefronts(addresses, width)
    kind = "store" if isinstance(node, BufferStore) else "load"
    return Access(buffer.name, kind, width, wavefronts, ideal)


def _itemsize(buffer: Buffer) -> int:
    return np.dtype(numpy_dtype(buffer.dtype)).itemsize


def _wavefronts(addresses: list[int], width: int) -> tuple[int, int]:
    """(wavefronts, ideal) of one warp request: lane n reads words addresses[n] ..
    addresses[n] + width - 1; phases of 32 / width lanes."""
    per_phase = max(WARP // max(width, 1), 1)
    total = phases = 0
    for start in range(0, len(addresses), per_phase):
        banks: dict[int, set[int]] = {}
        for a in addresses[start : start + per_phase]:
            for w in range(a, a + width):
                banks.setdefault(w % BANKS, set()).add(w)
        total += max(len(words) for words in banks.values())
        phases += 1
    return total, phases


# ---------------------------------------------------------------------------------------------
# Occupancy


def _occupancy(kernel: CudaKernel) -> tuple[int, float]:
    shared_sm, threads_sm, blocks_sm, _ = LIMITS.get(kernel.binary.arch, LIMITS["sm_90"])
    threads = math.prod(kernel.block)
    warps = -(-threads // WARP)
    registers = kernel.resources.get("registers", 0)
    per_warp = -(-registers * WARP // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = REGISTERS_PER_SM // (per_warp * warps) if per_warp else blocks_sm
    shared = kernel.resources.get("shared_bytes", 0) + kernel.shared_bytes + RESERVED_SHARED
    blocks = min(blocks_sm, threads_sm // (warps * WARP), by_registers, shared_sm // shared)
    return blocks, blocks * warps / (threads_sm // WARP)


# ---------------------------------------------------------------------------------------------
# The inner loop's issue mix


def _issue_mix(body, threads: dict[Var, str], lanes):  # noqa: ANN001, ANN202
    """(FMA clocks, memory clocks, {shared load: its Access}) per warp for one iteration of
    the innermost rolled loop around the contraction's update (a block whose value
    multiplies two loads from memory). A load from global memory (read through L1, the same
    SRAM and bandwidth as shared memory) takes a wavefront per 128-byte line the warp
    touches."""
    found = _update(body, [])
    if found is None:
        return 0.0, 0.0, {}
    update, loops = found
    unrolls = _unrolled(loops)
    rolled = [n for n, lp in enumerate(loops) if lp.kind in ("serial", "parallel")
              and lp not in unrolls]  # fmt: skip
    inner = loops[rolled[-1] + 1 :] if rolled else loops
    unrolled = [lp for lp in inner if lp.kind in ("unrolled", "vthread") or lp in unrolls]
    space = [range(lp.extent) for lp in unrolled]
    fmas = math.prod(lp.extent for lp in unrolled)
    clocks = 0.0
    accesses: dict[BufferLoad, Access] = {}
    for load in _memory_loads(update):
        indices = tuple(substitute(i, update.bindings) for i in load.indices)
        flat = arith.flat_index(load.buffer, indices)
        base = {v: lanes[0][kind] for v, kind in threads.items()}
        values = set()
        for point in itertools.product(*space):
            values.add(
                _value(flat, base | {lp.var: p for lp, p in zip(unrolled, point, strict=True)})
            )
        width = _vector_width(sorted(v for v in values if v is not None))
        addresses = [_value(flat, {v: lane[k] for v, k in threads.items()}) or 0 for lane in lanes]
        if load.buffer.scope == "shared":
            wavefronts, ideal = _wavefronts(addresses, width)
            accesses[load] = Access(load.buffer.name, "load", width, wavefronts, ideal)
        else:  # lines of 32 words
            wavefronts = len({w // BANKS for a in addresses for w in range(a, a + width)})
        clocks += len(values) // width * wavefronts
    return fmas * WARP / FMA_LANES_PER_CLOCK, clocks, accesses


def _unrolled(loops: list[For]) -> list[For]:
    """The serial loops of `loops` (outermost first) that the printer unrolls under the
    nearest enclosing AUTO_UNROLL_KEY (a sampled schedule's `pragma_auto_unroll_max_step`)."""
    step, found = 0, []
    for lp in loops:
        value = dict(lp.annotations).get(AUTO_UNROLL_KEY)
        if isinstance(value, int) and not isinstance(value, bool):
            step = value
        if auto_unrolled(lp, step):
            found.append(lp)
    return found


@dataclass(frozen=True)
class _Update:
    block: Block | BufferStore  # a block, or a store outside blocks (the flash nest's)
    bindings: dict  # the enclosing blocks' iter vars -> their bindings in loop vars


def _update(stmt, loops: list[For]):  # noqa: ANN001, ANN202
    """The contraction's update (a block, or a store outside blocks, whose value multiplies
    two loads, at least one from shared or global memory, the other maybe a register) and
    the loops around it; of several (the flash nest's scores, values and output), the one
    that runs the most times: the kernel's inner loop."""
    found = list(_updates(stmt, loops, {}))
    return max(found, key=lambda f: math.prod(lp.extent for lp in f[1]), default=None)


def _updates(stmt, loops: list[For], bound: dict):  # noqa: ANN001, ANN202
    if isinstance(stmt, For):
        yield from _updates(stmt.body, [*loops, stmt], bound)
        return
    if isinstance(stmt, Block):
        bound = bound | {iv.var: substitute(iv.binding, bound) for iv in stmt.iter_vars}
        if len(_memory_loads(stmt)) >= 2:
            if any(isinstance(n, Binary) and n.op == "*" for n in walk(stmt.body)):
                yield _Update(stmt, bound), loops
                return
    if isinstance(stmt, BufferStore) and _multiplies_memory(stmt.value):
        yield _Update(stmt, bound), loops
    for child in sub_stmts(stmt):
        yield from _updates(child, loops, bound)


def _multiplies_memory(value: Expr) -> bool:
    """Whether `value` multiplies two loads, one of them from shared or global memory."""
    for n in walk(value):
        if isinstance(n, Binary) and n.op == "*":
            loads = [x for x in (n.a, n.b) if isinstance(x, BufferLoad)]
            if len(loads) == 2 and any(x.buffer.scope != "local" for x in loads):
                return True
    return False


def _memory_loads(block: Block | BufferStore | _Update) -> list[BufferLoad]:
    """The distinct loads of `block` from shared or global memory (not registers)."""
    if isinstance(block, _Update):
        block = block.block
    loads: dict[tuple, BufferLoad] = {}
    for n in walk(block.body if isinstance(block, Block) else block.value):
        if isinstance(n, BufferLoad) and n.buffer.scope in ("shared", "global"):
            loads.setdefault((n.buffer.name, n.indices), n)
    return list(loads.values())


def _vector_width(values: list[int]) -> int:
    """4 or 2 where the distinct indices a thread reads come in aligned runs of consecutive
    words that long (ptxas merges them into LDS.128 / LDS.64), else 1."""
    for width in (4, 2):
        runs = len(values) % width == 0 and all(
            values[i] % width == 0
            and values[i : i + width] == list(range(values[i], values[i] + width))
            for i in range(0, len(values), width)
        )
        if values and runs:
            return width
    return 1


# ---------------------------------------------------------------------------------------------
# Tensor cores: mma.sync per warp, fed by fragment loads


def _mma_mix(body, threads: dict[Var, str], lanes, arch: str):  # noqa: ANN001, ANN202
    """(tensor clocks, memory clocks, {}) per warp for one iteration of the innermost rolled
    loop around a tensorized warp nest (None where there is none): an m16n8k16 takes
    MMA_FMAS / the arch's dense tensor FMAs per clock of a multiprocessor; each distinct
    fragment the unrolled loops load (the printer loads one once per straight-line run,
    cuda_mma.py) its wavefronts: ldmatrix one per 8x8 matrix without conflicts, else the
    bank model on each 16-bit load of the lanes."""
    found = _tensorized(body, [])
    if found is None:
        return None
    loop, around, intrinsic = found
    lane = next((lp.var for lp in around if lp.kind == "threadIdx.x"), None)
    ranges = {n.var: n.extent for n in walk(body) if isinstance(n, For)}
    match = match_mma(loop, intrinsic, ranges, lane) if lane is not None else None
    if not isinstance(match, MmaMatch):
        return None
    rolled = [n for n, lp in enumerate(around) if lp.kind in ("serial", "parallel")]
    unrolled = [lp for lp in around[rolled[-1] + 1 if rolled else 0 :] if lp.kind == "unrolled"]
    base = {v: lanes[0][kind] for v, kind in threads.items()}
    clocks = 0.0
    accesses: dict[BufferLoad, Access] = {}
    for which, tile, strides in (("a", match.a, match.a_strides), ("b", match.b, match.b_strides)):
        flat = arith.flat_index(tile.buffer, tile.indices)
        starts = {
            _value(flat, base | {lp.var: p for lp, p in zip(unrolled, point, strict=True)})
            for point in itertools.product(*(range(lp.extent) for lp in unrolled))
        }
        ldsm = ldsm_kind(tile, strides, which, flat, ranges)
        loads = [_fragment_wavefronts(tile, strides, which, s or 0, ldsm) for s in starts]
        clocks += sum(w for w, _ in loads)
        worst = max(loads, key=lambda x: x[0] / x[1])
        access = Access(tile.buffer.name, "load", 4 if ldsm else 1, *worst)
        for n in walk(loop):  # the nest's own loads of the tile stand for the fragments'
            if isinstance(n, BufferLoad) and n.buffer == tile.buffer:
                accesses[n] = access
    mmas = math.prod(lp.extent for lp in unrolled)
    tensor = mmas * MMA_FMAS / TENSOR_FMAS_PER_CLOCK.get(arch, TENSOR_FMAS_PER_CLOCK["sm_90"])
    return tensor, clocks, accesses


def _tensorized(stmt, loops: list[For]):  # noqa: ANN001, ANN202
    """(the first loop tensorized with a WarpMma, the loops around it, the intrinsic)."""
    if isinstance(stmt, For):
        known = INTRINSICS.get(str(dict(stmt.annotations).get(TENSORIZE)))
        if isinstance(known, WarpMma):
            return stmt, loops, known
        return _tensorized(stmt.body, [*loops, stmt])
    for child in sub_stmts(stmt):
        found = _tensorized(child, loops)
        if found is not None:
            return found
    return None


def _fragment_wavefronts(
    tile: BufferLoad,
    strides: tuple[int, int],
    which: str,
    start: int,
    ldsm: tuple[str, int] | None,
) -> tuple[int, int]:
    """(wavefronts, ideal) of loading a warp's fragments of `tile` (origin at element
    `start`): ldmatrix's matrices (8 rows of 4 words each), or each 16-bit load's lanes."""
    if ldsm is not None:
        matrices = ldsm_rows(*ldsm)
        waves = sum(_wavefronts([(start + r) // 2 for r in rows], 4)[0] for rows in matrices)
        return waves, len(matrices)
    first, second = strides
    if which == "a":  # rows lane/4 (+8), k 2*(lane%4) (+1, +8, +9)
        steps = [(dr, dk) for dr in (0, 8) for dk in (0, 1, 8, 9)]
        offsets = [
            [((lane >> 2) + dr) * first + (2 * (lane & 3) + dk) * second for lane in range(WARP)]
            for dr, dk in steps
        ]
    else:  # k 2*(lane%4) (+1, +8, +9), column lane/4
        offsets = [
            [(2 * (lane & 3) + dk) * first + (lane >> 2) * second for lane in range(WARP)]
            for dk in (0, 1, 8, 9)
        ]
    total = 0
    for lane_offsets in offsets:
        words = [(start + o) * 2 // 4 for o in lane_offsets]
        if tile.buffer.scope == "shared":
            total += _wavefronts(words, 1)[0]
        else:
            total += len({w // BANKS for w in words})
    return total, len(offsets)


__all__ = ["Access", "Report", "analyze"]
