"""Search: the space of schedules, their measurement, and the search over them (DESIGN.md §5).

Measurement (measure.py): `Candidate`, `BuildResult`, `MeasureResult`, the `Builder` and
`Runner` protocols and `measure`; CpuBuilder / CudaBuilder (builders.py); CpuRunner /
CudaRunner (runners.py, the CPU one over a worker process, worker.py).
"""

from hexir.search.builders import CpuBuilder, CudaBuilder
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

__all__ = [
    "ERROR_KINDS",
    "BuildResult",
    "Builder",
    "Candidate",
    "CpuBuilder",
    "CpuRunner",
    "CudaBuilder",
    "CudaRunner",
    "MeasureResult",
    "Runner",
    "measure",
]
