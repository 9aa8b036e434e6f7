"""log_softmax end to end, from its one definition: numpy semantics (stable where a naive
log(sum(exp(x))) overflows), the text forms, the default CPU schedule (rows in parallel, the
max and the sum of exponentials in vector lanes), a compiled module with its elementwise
producer fused in, and the GPU schedules, which compile with NVRTC (no GPU needed) and compute
numpy's answer on the CPU path. ONNX import and export: tests/frontend."""

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
from hexir.runtime.default_schedule import CHAINS, MIN_PARALLEL_ITERATIONS, default_schedule
from hexir.runtime.target import Target
from hexir.schedule import Trace
from hexir.schedule.common import all_blocks

# (rows, row length, the root loop's kind). 1000: ImageNet's classes; 197: ViT's odd token
# count; 12: shorter than two vectors. 5x12 is too little work to share among the cores.
ROWS = [(256, 1000, "parallel"), (64, 197, "parallel"), (5, 12, "serial")]
STAGES = ["log_softmax_max", "log_softmax_sum", "log_softmax_norm"]
# Logits up to ±100: exp overflows float32 from 88.7 on, so the naive log(sum(exp(x))) gives
# inf (and -inf results) on such rows; the stable form stays finite and exact.
LARGE = 100.0


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """numpy's answer in float64: x - logsumexp(x), the max taken out before the exp."""
    x64 = x.astype(np.float64)
    mx = x64.max(axis=axis, keepdims=True)
    return x64 - (mx + np.log(np.exp(x64 - mx).sum(axis=axis, keepdims=True)))


def one_op(shape: tuple[int, ...], axis: int = -1) -> Graph:
    b = GraphBuilder("logits")
    return b.build(b.log_softmax(b.input("x", shape), axis=axis))


def logits(shape: tuple[int, ...], rng: np.random.Generator, scale: float = 2.0) -> np.ndarray:
    """Fresh inputs in [-scale, scale]."""
    return rng.uniform(-scale, scale, shape).astype(np.float32)


def run_on_cpu(func: PrimFunc, scheduled: PrimFunc, rng: np.random.Generator) -> None:
    """The scheduled func, its output poisoned with NaN, computes numpy's answer for `func`,
    on ordinary inputs and on large ones."""
    kernel = hexir.build(scheduled, "cpu")
    (param,) = func.inputs
    for scale in (2.0, LARGE):
        x, y = logits(param.shape, rng, scale), np.full(func.outputs[0].shape, np.nan, np.float32)
        kernel(x, y)
        np.testing.assert_allclose(y, log_softmax(x, -1), rtol=1e-5, atol=2e-5 * scale)


@pytest.mark.parametrize("shape,axis", [((4, 1000), -1), ((6, 197), 1), ((2, 5, 7), 1)])
@pytest.mark.parametrize("scale", [2.0, LARGE])
def test_evaluate_matches_numpy(shape, axis, scale, rng):
    graph = one_op(shape, axis)
    op = graph.ops[0]
    assert dict(op.attrs) == {"axis": axis % len(shape)}
    assert op_flops(op) == 5 * np.prod(shape)
    x = logits(shape, rng, scale)
    (got,) = evaluate(graph, [x])
    assert got.dtype == np.float32 and got.shape == shape and np.isfinite(got).all()
    np.testing.assert_allclose(got, log_softmax(x, axis), rtol=1e-6, atol=1e-6)
    with np.errstate(over="ignore"):  # the naive form loses every row with a large logit
        naive = x - np.log(np.exp(x).sum(axis=axis, keepdims=True))
    assert np.isfinite(naive).all() == (scale < LARGE)


def test_the_text_forms_round_trip():
    graph = one_op((2, 3, 8), axis=-2)
    text = print_graph(graph)
    assert "hexir.log_softmax %x {axis = 1" in text
    assert parse_graph(text) == graph
    func = hexir.workload("log_softmax", M=4, N=8)
    assert [p.name for p in func.params] == ["X", "Y"]
    assert [b.name for b in all_blocks(func.body)] == STAGES
    assert "exp(" in str(func) and "log(" in str(func)
    hexir.verify(func)
    assert hexir.parse(str(func)) == func


@pytest.mark.parametrize("M,N,kind", ROWS)
def test_the_default_cpu_schedule_runs_rows_in_parallel_reducing_in_lanes(M, N, kind, rng):
    func = hexir.workload("log_softmax", M=M, N=N)
    sch = default_schedule(func, "cpu")
    roots = root_loops(sch.func)
    # One loop over the rows with every stage inside: parallel where there is work to share.
    shared = M * N * len(STAGES) >= MIN_PARALLEL_ITERATIONS
    assert shared == (kind == "parallel")
    assert [lp.kind for lp in roots] == [kind]
    assert set(STAGES) <= {b.name for b in all_blocks(roots[0].body)}
    kinds = {lp.kind for lp in walk(sch.func.body) if isinstance(lp, For)}
    assert "vectorized" in kinds  # the norm stage, and the partial results where rows are long
    lanes = Target("cpu").vector_width
    if N >= 2 * lanes:  # the max and the sum: partials in lanes (long rows: in chains)
        assert str(sch.trace).count("rfactor") == 2
        chains = CHAINS if N >= 4 * CHAINS * lanes else 1
        write_backs = [
            lp for lp in walk(sch.func.body) if isinstance(lp, For) and lp.var.name.endswith("_wb")
        ]
        assert [(lp.kind, lp.extent) for lp in write_backs] == [("vectorized", chains * lanes)] * 2
    assert Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
    source = hexir.build(sch.func, "cpu").source
    assert ("omp parallel" in source) == shared
    run_on_cpu(func, sch.func, rng)


def test_a_scaled_producer_fuses_in_and_the_compiled_module_matches_numpy(rng):
    b = GraphBuilder("classifier")
    x = b.input("x", (256, 1000))
    y = b.mul(b.log_softmax(b.mul(x, b.constant(np.float32(50.0)))), b.constant(np.float32(-1)))
    graph = b.build(y)
    # A reduction ends its group, like softmax: the producer joins it, the consumer not.
    groups = [[op.kind for op in g.ops] for g in partition(graph)]
    assert groups == [["mul", "log_softmax"], ["mul"]]
    module = hexir.compile(graph, target="cpu")
    assert len(module.kernels) == 2
    xs = [logits((256, 1000), rng)]  # scaled to ±100 inside the kernel
    (got,) = module.run(xs)
    np.testing.assert_allclose(got, -log_softmax(xs[0] * 50, -1), rtol=1e-5, atol=2e-3)


@pytest.mark.parametrize("shape,axis", [((6, 197, 5), 1), ((1000, 7), 0), ((3, 4, 5), -1)])
def test_over_another_axis_the_compiled_module_matches_numpy(shape, axis, rng):
    module = hexir.compile(one_op(shape, axis), target="cpu")
    for scale in (2.0, LARGE):
        x = logits(shape, rng, scale)
        (got,) = module.run([x])
        np.testing.assert_allclose(got, log_softmax(x, axis), rtol=1e-5, atol=2e-5 * scale)


@pytest.mark.parametrize("M,N", [(4, 1000), (197, 197)])
def test_the_hand_gpu_schedule_is_one_block_per_row_and_compiles_with_nvrtc(M, N, rng):
    func = hexir.workload("log_softmax", M=M, N=N)
    check_hand_gpu_schedule(func, M, ("expf(", "logf("), run_on_cpu, rng)


def test_gpu_sketch_samples_replay_and_compute_numpy_on_the_cpu():
    check_gpu_sketch_samples(hexir.workload("log_softmax", M=6, N=48), run_on_cpu)
