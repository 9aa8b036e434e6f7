"""`hexir.build`: a PrimFunc to a kernel you can call.

kernel = hexir.build(func)                  # target "cpu"
kernel(a, b, c)
source = c_source(func, "cpu")              # the C that build compiles for func
kernels = build_all(funcs, target)          # several, the C compiles side by side
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from hexir import knobs
from hexir.codegen.c import generate_c
from hexir.errors import BuildError, HexirError
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
    """`build` of each func, in order. On the CPU each kernel's C is printed in this thread,
    one after another, and compiled on a pool of `build_workers` threads (a knob; 0 = one per
    core) as soon as it is printed: the C compiler runs as a subprocess beside the printing
    of the next kernels, where threads printing side by side would only take turns at the
    interpreter (ResNet-18's 49 kernels, their libraries cached: 12-14 s on two threads
    against 9 s on one). The first error raises, as a sequential build would."""
    from hexir.runtime.build_cache import cached_c_source  # it prints with c_source

    target = Target.of(target)
    if target.kind == "cuda":
        return [build(func, target) for func in funcs]
    workers = knobs.get().build_workers or Target("cpu").num_cores
    if workers <= 1 or len(funcs) <= 1:
        return [build(func, target, cached_c_source(func, target)) for func in funcs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hexir-build") as pool:
        built: list[Future] = []
        for func in funcs:
            try:
                source = cached_c_source(func, target)
            except HexirError:  # raised after the errors of the kernels before it
                for kernel in built:
                    kernel.result()
                raise
            built.append(pool.submit(build, func, target, source))
        return [kernel.result() for kernel in built]


def _build_cuda(func: PrimFunc, target: Target) -> CudaKernel:
    from hexir.codegen.cuda import generate_cuda  # the CUDA printer loads for CUDA builds only

    # generate_cuda compacts the caches and checks the launch against the target (gpu_verify).
    cuda = generate_cuda(func, target, fast_math=knobs.get().cuda_fast_math)
    binary = compile_cuda(cuda.source, target, cuda.name)
    return CudaKernel(
        func, cuda.source, binary, target, cuda.name, cuda.grid, cuda.block, cuda.shared_bytes
    )
