"""Search: the space of schedules, their measurement, and the search over them (DESIGN.md §5).

Measurement (measure.py): `Candidate`, `BuildResult`, `MeasureResult`, the `Builder` and
`Runner` protocols and `measure`; CpuBuilder / CudaBuilder (builders.py); CpuRunner /
CudaRunner (runners.py, the CPU one over a worker process, worker.py). The space
(space.py): `SearchSpace` and `sample`, from the sketch rules of sketch_cpu.py and sketch_gpu.py.
Executors (executor.py, distributed.py): `LocalExecutor` in-process, `RayExecutor` on Ray.
"""

from hexir.search.builders import CpuBuilder, CudaBuilder
from hexir.search.distributed import RayExecutor
from hexir.search.executor import LocalExecutor, MeasureExecutor
from hexir.search.measure import (
    ERROR_KINDS,
    Builder,
    BuildResult,
    Candidate,
    MeasureResult,
    Runner,
    measure,
)
from hexir.search.runners import CpuRunner, CudaRunner
from hexir.search.space import SearchSpace, sample

__all__ = [
    "ERROR_KINDS",
    "BuildResult",
    "Builder",
    "Candidate",
    "CpuBuilder",
    "CpuRunner",
    "CudaBuilder",
    "CudaRunner",
    "LocalExecutor",
    "MeasureExecutor",
    "MeasureResult",
    "RayExecutor",
    "Runner",
    "SearchSpace",
    "measure",
    "sample",
]
