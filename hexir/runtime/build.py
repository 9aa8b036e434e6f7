"""`hexir.build`: a PrimFunc to a kernel you can call.

kernel = hexir.build(func)                  # target "cpu"
kernel(a, b, c)
source = c_source(func, "cpu")              # the C that build compiles for func
kernels = build_all(funcs, target)          # several, the C compiles side by side
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from hexir import knobs
from hexir.codegen.c import generate_c
from hexir.errors import BuildError
from hexir.ir.tir import PrimFunc
from hexir.runtime.cc import compile_c
from hexir.runtime.cuda_kernel import CudaKernel
from hexir.runtime.kernel import CpuKernel
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule.compact import compact_buffers


def build(
    func: PrimFunc, target: Target | str = "cpu", source: str | None = None
) -> CpuKernel | CudaKernel:
    """Generate C (or CUDA C) for `func`, compile it (or take it from the build cache) and
    load it. A CUDA kernel compiles with NVRTC here and needs a GPU only when called. On the
    CPU, `source` is `c_source(func, target)` where the caller has already made it."""
    target = Target.of(target)
    if target.kind == "cuda" and func.symbols:
        raise BuildError(
            f"kernel {func.name} has symbolic extents ({', '.join(func.symbols)}): those build "
            "for the CPU only; specialize the graph to its sizes for CUDA"
        )
    if target.kind == "cuda":
        return _build_cuda(func, target)
    source = source if source is not None else c_source(func, target)
    path = compile_c(source, target)
    return CpuKernel(func, source, path, target)


def c_source(func: PrimFunc, target: Target | str = "cpu", max_lines: int | None = None) -> str:
    """The C that `build` compiles for `func` on a CPU target; `max_lines`: raise
    SourceTooLong (hexir/codegen/c_lower.py) once its body passes that many lines, or its
    lowering copies past them (c_lower.PIECE_NODES_PER_LINE)."""
    # Caches placed by the schedule shrink to the tiles they hold (a lowering step).
    return generate_c(compact_buffers(func), Target.of(target),
                      vector_math=knobs.get().vector_math, max_lines=max_lines)  # fmt: skip


def build_all(funcs: Sequence[PrimFunc], target: Target | str = "cpu") -> list:
    """`build` of each func, in order. On the CPU the C compiler runs as a subprocess, so a
    pool of `build_workers` threads (a knob; 0 = one per core) keeps that many compiles going;
    the first error raises, as a sequential build would."""
    target = Target.of(target)
    workers = knobs.get().build_workers or Target("cpu").num_cores
    if target.kind == "cuda" or workers <= 1 or len(funcs) <= 1:
        return [build(func, target) for func in funcs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hexir-build") as pool:
        return list(pool.map(lambda func: build(func, target), funcs))


def _build_cuda(func: PrimFunc, target: Target) -> CudaKernel:
    from hexir.codegen.cuda import generate_cuda  # the CUDA printer loads for CUDA builds only

    # generate_cuda compacts the caches and checks the launch against the target (gpu_verify).
    cuda = generate_cuda(func, target, fast_math=knobs.get().cuda_fast_math)
    binary = compile_cuda(cuda.source, target, cuda.name)
    return CudaKernel(
        func, cuda.source, binary, target, cuda.name, cuda.grid, cuda.block, cuda.shared_bytes
    )
