"""Hexir: a tensor compiler whose schedules are data, searched for speed.

`import hexir` needs numpy only; every other dependency loads where it is used.
The public API (DESIGN.md §9) resolves lazily from the modules below.
"""

from __future__ import annotations

import importlib
from typing import Any

from hexir import knobs
from hexir.errors import (
    BuildError,
    DatabaseError,
    HexirError,
    MeasureError,
    ModelError,
    ParseError,
    ResourceError,
    ScheduleError,
    SpaceError,
    TargetError,
    TypeInferenceError,
)

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "parse": "hexir.ops.parse",
    "workload_key": "hexir.ir.keys",
    "candidate_key": "hexir.ir.keys",
    "verify": "hexir.ir.verify",
    "GraphBuilder": "hexir.ops.builder",
    "Graph": "hexir.ir.graph",
    "TensorType": "hexir.ir.graph",
    "PrimFunc": "hexir.ir.tir",
    "Buffer": "hexir.ir.tir",
    "workload": "hexir.graph.workloads",
    "reference": "hexir.graph.reference",
    "lower": "hexir.graph.lower",
    "Schedule": "hexir.schedule",
    "Trace": "hexir.schedule",
    "Target": "hexir.runtime.target",
    "Database": "hexir.database",
    "load_model": "hexir.frontend.load",
    "save_model": "hexir.frontend.load",
    "export_onnx": "hexir.frontend.onnx_export",
    "quantize": "hexir.frontend.quantize",
    "import_onnx": "hexir.frontend.onnx_import",
    "build": "hexir.runtime.build",
    "compile": "hexir.runtime.executor",
    "tune": "hexir.search.tune",
    "specialize": "hexir.graph.specialize",
    "generate": "hexir.serve.generate",
}

__all__ = [
    "BuildError",
    "DatabaseError",
    "HexirError",
    "MeasureError",
    "ModelError",
    "ParseError",
    "ResourceError",
    "ScheduleError",
    "SpaceError",
    "TargetError",
    "TypeInferenceError",
    "knobs",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hexir' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
