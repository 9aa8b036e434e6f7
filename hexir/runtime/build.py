"""`hexir.build`: a PrimFunc to a kernel you can call.

kernel = hexir.build(func)                  # target "cpu"
kernel(a, b, c)
"""

from __future__ import annotations

from hexir.codegen.c import generate_c
from hexir.errors import TargetError
from hexir.ir.tir import PrimFunc
from hexir.runtime.cc import compile_c
from hexir.runtime.kernel import CpuKernel
from hexir.runtime.target import Target
from hexir.schedule.compact import compact_buffers


def build(func: PrimFunc, target: Target | str = "cpu") -> CpuKernel:
    """Generate C for `func`, compile it (or take it from the build cache) and load it."""
    target = Target.of(target)
    if target.kind != "cpu":
        raise TargetError(
            f"the CUDA backend is not built yet: cannot build {func.name!r} for "
            f"{str(target)!r}; build for target 'cpu'"
        )
    # Caches placed by the schedule shrink to the tiles they hold (a lowering step).
    source = generate_c(compact_buffers(func), target)
    path = compile_c(source, target)
    return CpuKernel(func, source, path, target)
