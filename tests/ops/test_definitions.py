"""One op, one definition: every op's facets live in its `OpDef`, and a new op needs nothing else.

A toy op defined here (softplus with a `beta` attribute), put into `OPS` for one test only,
is built, printed and parsed, evaluated, fused, lowered, compiled, run and exported without a
line of Hexir changing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import hexir
from hexir.frontend.onnx_export import export_onnx
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import partition, pattern
from hexir.graph.lower import lower
from hexir.ir.graph import Graph, Op, TensorType
from hexir.ir.graph_text import print_graph
from hexir.ir.op_attrs import Check
from hexir.ir.tir import Buffer, Call, const
from hexir.ops import FAMILIES, OPS, Exporter, OpDef, Pattern, make_op, op_def
from hexir.ops.builder import GraphBuilder
from hexir.ops.compute import Kernel
from hexir.ops.numeric import Attrs, f64, get_float
from hexir.ops.parse import parse_graph

ROOT = Path(__file__).parents[2]


# ---------------------------------------------------------------------------------------------
# Every op has every facet


def test_every_op_has_every_facet():
    for name, d in OPS.items():
        assert d.name == name and d.doc, name
        assert callable(d.infer) and callable(d.export), name
        assert isinstance(d.fusion, Pattern), name
        assert d.operands or name in ("constant", "arange"), name  # the sources
        assert (d.cheap is not None) <= (d.fusion is Pattern.INJECTIVE), name
    # Only the constant has no numpy function and no kernel: its value is the graph's data.
    assert {name for name, d in OPS.items() if d.evaluate is None} == {"constant"}
    assert {name for name, d in OPS.items() if d.lower is None} == {"constant"}
    assert OPS["constant"].fusion is Pattern.OPAQUE


def test_the_table_is_the_families_gathered():
    defined = [d for family in FAMILIES for d in family.OPS]
    assert [d.name for d in defined] == list(OPS)  # each op defined once
    assert op_def("hexir.matmul") is OPS["matmul"] and op_def("frobnicate") is None


def test_the_executor_writes_in_place_over_elementwise_and_broadcast_ops():
    pointwise = {name for name, d in OPS.items() if d.pointwise}
    assert pointwise == {
        *("add", "sub", "mul", "div", "maximum", "minimum", "power", "where", "cast", "gelu"),
        *("mod", "fmod", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"),
        *("relu", "sigmoid", "tanh", "exp", "log", "erf", "sqrt", "rsqrt"),
        *("floor", "ceil", "round", "sin", "cos", "sign"),
        *("bias_add", "batch_norm"),
        *("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"),
    }


def test_docs_list_the_ops_in_table_order():
    listed = []
    for line in (ROOT / "docs" / "ops.md").read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| op ") and "---" not in line:
            listed += [k.strip() for k in line.split("|")[1].split(",")]
    assert listed == list(OPS)


# Imports point one way (STYLE.md): ir <- ops <- graph <- ...; frontend beside, used from above.
_ABOVE_OPS = ("graph", "schedule", "codegen", "runtime", "search", "costmodel", "cli")
_BESIDE = ("frontend", "database")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", ["ir", "ops"])
def test_imports_point_one_way(package):
    banned = (*_ABOVE_OPS, *_BESIDE) + (("ops",) if package == "ir" else ())
    for path in sorted((ROOT / "hexir" / package).glob("*.py")):
        for module in _imports(path):
            parts = module.split(".")
            assert parts[0] != "onnx", f"{path.name} imports {module}"
            bad = parts[0] == "hexir" and len(parts) > 1 and parts[1] in banned
            assert not bad, f"hexir/{package}/{path.name} imports {module}"


# ---------------------------------------------------------------------------------------------
# A new op is one definition


def _softplus_infer(c: Check) -> TensorType:
    c.dtype_in("float")
    c.real("beta", 1.0)
    return c.types[0]


def _softplus_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    beta = get_float(attrs, "beta")
    return np.log1p(np.exp(beta * f64(xs[0]))) / beta


def _softplus_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    (x,) = args
    dt, beta = x.dtype, float(op.attr("beta"))  # type: ignore[arg-type]

    def value(i):
        grown = Call("exp", (const(beta, dt) * x[i],))
        return Call("log", (const(1, dt) + grown,)) / const(beta, dt)

    k.compute("softplus", out, value)


def _softplus_export(ex: Exporter, op: Op) -> None:
    (x,) = op.operands
    out, beta = op.result.name, float(op.attr("beta"))  # type: ignore[arg-type]
    scaled = ex.node("Mul", [x.name, ex.scalar(beta, x, f"{out}.beta")])
    ex.node("Div", [ex.node("Softplus", [scaled]), ex.scalar(beta, x, f"{out}.over")], out)


SOFTPLUS = OpDef(
    "softplus",
    "log(1 + exp(beta·x)) / beta",
    ("x",),
    ("beta",),
    infer=_softplus_infer,
    fusion=Pattern.ELEMENTWISE,
    evaluate=_softplus_evaluate,
    lower=_softplus_lower,
    export=_softplus_export,
)


@pytest.fixture
def softplus(monkeypatch: pytest.MonkeyPatch) -> OpDef:
    """The toy op in the table for this test only (no registry: the table is a plain dict)."""
    monkeypatch.setitem(OPS, SOFTPLUS.name, SOFTPLUS)
    return SOFTPLUS


def _graph() -> Graph:
    b = GraphBuilder("toy")
    x = b.input("x", (4, 8))
    y = b.op("softplus", x, beta=2)
    return b.build(b.relu(b.add(y, x)))


def test_a_toy_op_is_checked_printed_and_parsed(softplus):
    graph = _graph()
    assert graph.ops[0].attrs == (("beta", 2.0),)
    assert parse_graph(print_graph(graph)) == graph
    with pytest.raises(hexir.TypeInferenceError, match="hexir.softplus: x must be a float"):
        make_op("softplus", [GraphBuilder("g").input("i", (2,), "int32")], {}, "r")


def test_a_toy_op_fuses_lowers_compiles_and_runs_as_numpy_says(softplus, rng):
    graph = _graph()
    (group,) = partition(graph)  # an elementwise op: one kernel with its consumers
    assert [pattern(op) for op in group.ops] == [Pattern.ELEMENTWISE] * 3
    func = lower(group.graph())
    assert "block @softplus(" in str(func) and hexir.parse(str(func)) == func
    x = rng.standard_normal((4, 8)).astype(np.float32)
    want = np.maximum(np.log1p(np.exp(2.0 * x.astype(np.float64))) / 2.0 + x, 0.0)
    (got,) = evaluate(graph, [x])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(hexir.reference(func, [x])[0], want, rtol=1e-6)
    module = hexir.compile(graph, target="cpu")
    (out,) = module.run([x])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_a_toy_op_exports_to_onnx(softplus, rng):
    graph = _graph()
    model = export_onnx(graph)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x})
    np.testing.assert_allclose(got, evaluate(graph, [x])[0], rtol=1e-5, atol=1e-6)
