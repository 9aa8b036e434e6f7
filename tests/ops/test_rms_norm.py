"""rms_norm end to end, from its one definition: numpy semantics, the text forms, the default
CPU schedule (rows in parallel, the sum of squares in vector lanes), a compiled module with
its elementwise producer fused in, and GPU schedules that compile with NVRTC (no GPU needed)
and compute numpy's answer on the CPU path. ONNX import and export: tests/frontend."""

from __future__ import annotations

import numpy as np
import pytest
from row_checks import check_gpu_sketch_samples, check_hand_gpu_schedule, root_loops

import hexir
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import partition
from hexir.ir.graph import Graph
from hexir.ir.graph_text import print_graph
from hexir.ir.tir import For, PrimFunc
from hexir.ir.visit import walk
from hexir.ops import op_flops
from hexir.ops.builder import GraphBuilder
from hexir.ops.parse import parse_graph
from hexir.runtime.default_schedule import MIN_PARALLEL_ITERATIONS, default_schedule
from hexir.runtime.target import Target
from hexir.schedule import Trace
from hexir.schedule.common import all_blocks

ROWS = [(4, 768), (197, 768), (5, 12)]  # 197: ViT's odd token count; 12: shorter than 2 vectors


def rms_norm(x: np.ndarray, scale: np.ndarray, axis: int, eps: float) -> np.ndarray:
    """numpy's answer, in float64, written from the ONNX RMSNormalization formula."""
    x64 = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    rms = np.sqrt(np.mean(x64 * x64, axis=axes, keepdims=True) + eps)
    return x64 / rms * scale.astype(np.float64)


def one_op(shape: tuple[int, ...], axis: int = -1, eps: float = 1e-5) -> Graph:
    b = GraphBuilder("rms")
    x, scale = b.input("x", shape), b.input("scale", shape[axis % len(shape) :])
    return b.build(b.rms_norm(x, scale, axis=axis, epsilon=eps))


def inputs_for(graph: Graph, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(v.type.shape).astype(np.float32) * 2 for v in graph.inputs]


def run_on_cpu(func: PrimFunc, scheduled: PrimFunc, rng: np.random.Generator) -> None:
    """The scheduled func, outputs poisoned with NaN, computes numpy's answer for `func`."""
    inputs = [rng.standard_normal(b.shape).astype(np.float32) for b in func.inputs]
    outputs = [np.full(b.shape, np.nan, np.float32) for b in func.outputs]
    hexir.build(scheduled, "cpu")(*inputs, *outputs)
    (x, scale), (y,) = inputs, outputs
    np.testing.assert_allclose(y, rms_norm(x, scale, -1, 1e-5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "shape,axis,eps", [((4, 768), -1, 1e-5), ((197, 768), 1, 1e-6), ((2, 3, 8), 1, 1e-3)]
)
def test_evaluate_matches_numpy(shape, axis, eps, rng):
    graph = one_op(shape, axis, eps)
    op = graph.ops[0]
    assert dict(op.attrs) == {"axis": axis % len(shape), "epsilon": eps}
    assert op_flops(op) == 4 * np.prod(shape)
    x, scale = inputs_for(graph, rng)
    (got,) = evaluate(graph, [x, scale])
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, rms_norm(x, scale, axis, eps), rtol=1e-6, atol=1e-6)


def test_the_text_forms_round_trip():
    graph = one_op((2, 3, 8), axis=-2, eps=1e-6)
    text = print_graph(graph)
    assert "hexir.rms_norm %x, %scale {axis = 1, epsilon = 1e-06" in text
    assert parse_graph(text) == graph
    func = hexir.workload("rms_norm", M=4, N=8, eps=1e-6)
    assert [p.name for p in func.params] == ["X", "scale", "Y"]
    assert [b.name for b in all_blocks(func.body)] == ["rms_norm_meansq", "rms_norm_norm"]
    assert "rsqrt(" in str(func) and "epsilon = 1e-06" in func.attr("source")
    hexir.verify(func)
    assert hexir.parse(str(func)) == func


@pytest.mark.parametrize("M,N", ROWS)
def test_the_default_cpu_schedule_runs_rows_in_parallel_reducing_in_lanes(M, N, rng):
    func = hexir.workload("rms_norm", M=M, N=N)
    sch = default_schedule(func, "cpu")
    roots = root_loops(sch.func)
    # One parallel region over the rows, where there is work enough to share.
    shared = M * N * 2 >= MIN_PARALLEL_ITERATIONS
    assert [lp.kind for lp in roots] == ["parallel" if shared else "serial"]
    assert {b.name for b in all_blocks(func.body)} <= {b.name for b in all_blocks(roots[0].body)}
    kinds = {lp.kind for lp in walk(sch.func.body) if isinstance(lp, For)}
    assert "vectorized" in kinds  # the norm stage, and the partial sums where rows are long
    if N >= 2 * Target("cpu").vector_width:
        assert "rfactor" in str(sch.trace)
    assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
    run_on_cpu(func, sch.func, rng)


def test_a_residual_add_fuses_in_and_the_compiled_module_matches_numpy(rng):
    b = GraphBuilder("block")
    x, residual = b.input("x", (197, 768)), b.input("residual", (197, 768))
    scale = b.constant(rng.uniform(0.5, 1.5, 768).astype(np.float32), name="scale")
    h = b.add(x, residual)
    y = b.mul(b.rms_norm(h, scale, epsilon=1e-6), b.constant(np.float32(0.5)))
    graph = b.build(y)
    # A reduction ends its group, like layer_norm: the producer joins it, the consumer not.
    assert [[op.kind for op in g.ops] for g in partition(graph)] == [["add", "rms_norm"], ["mul"]]
    module = hexir.compile(graph, target="cpu")
    assert len(module.kernels) == 2
    xs = inputs_for(graph, rng)
    (got,) = module.run(xs)
    want = rms_norm(xs[0] + xs[1], graph.constants[0][1].array, -1, 1e-6) * 0.5
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_over_trailing_axes_the_compiled_module_matches_numpy(rng):
    graph = one_op((6, 4, 48), axis=1)
    xs = inputs_for(graph, rng)
    (got,) = hexir.compile(graph, target="cpu").run(xs)
    np.testing.assert_allclose(got, rms_norm(*xs, 1, 1e-5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("M,N", [(4, 768), (197, 768)])
def test_the_hand_gpu_schedule_is_one_block_per_row_and_compiles_with_nvrtc(M, N, rng):
    func = hexir.workload("rms_norm", M=M, N=N)
    check_hand_gpu_schedule(func, M, ("rsqrtf(",), run_on_cpu, rng)


def test_gpu_sketch_samples_replay_and_compute_numpy_on_the_cpu():
    check_gpu_sketch_samples(hexir.workload("rms_norm", M=6, N=48), run_on_cpu)
