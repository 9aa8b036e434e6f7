"""The `attention` op (hexir/ops/attention.py): softmax(q·kt·scale + bias, causal)·v against a
numpy reference written here, on fresh random inputs, through the reference evaluator, the
CPU kernel with its attention schedule (hexir/schedule/handwritten_attention.py, also at
ragged and decode shapes) and the CUDA kernel its default GPU schedule makes (NVRTC for
sm_80 and sm_90; computed on the CPU path); its checks, text form and ONNX export."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime
import pytest

import hexir
from hexir.codegen.cuda import generate_cuda
from hexir.errors import TypeInferenceError
from hexir.graph.evaluate import evaluate
from hexir.graph.fusion import fused_kernels
from hexir.graph.lower import lower_op
from hexir.ir.graph_text import print_graph
from hexir.ops.builder import GraphBuilder
from hexir.ops.parse import parse_graph
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule.handwritten_attention import attention_schedule


def reference(q, kt, v, scale, causal, bias=None):
    scores = (q.astype(np.float64) @ kt) * scale
    if bias is not None:
        scores = scores + bias
    if causal:
        s, t = scores.shape[1:]
        seen = np.arange(t)[None, :] <= np.arange(s)[:, None] + t - s
        scores = np.where(seen, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def graph(b, s, t, d, dv, causal, bias_shape=None, scale=None):
    g = GraphBuilder("attn")
    operands = [g.input("q", (b, s, d)), g.input("kt", (b, d, t)), g.input("v", (b, t, dv))]
    if bias_shape is not None:
        operands.append(g.input("bias", bias_shape))
    attrs = {"causal": causal} if scale is None else {"causal": causal, "scale": scale}
    return g.build([g.op("attention", *operands, **attrs)])


def inputs(g, rng):
    return [rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs]


SHAPES = [  # batch, queries, keys, width, value width, causal, bias shape
    (3, 5, 7, 4, 4, True, None),
    (2, 64, 64, 16, 32, False, (2, 1, 64)),
    (4, 33, 64, 16, 64, True, (33, 64)),
    (2, 1, 128, 64, 64, False, None),  # a decode step's one query
    (2, 197, 197, 64, 64, False, None),  # ViT's sequence: no tile divides it
    (12, 100, 128, 64, 64, True, None),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])))
def test_attention_matches_numpy_evaluated_and_compiled(rng, shape):
    *dims, causal, bias_shape = shape
    g = graph(*dims, causal, bias_shape)
    xs = inputs(g, rng)
    want = reference(*xs[:3], 1 / np.sqrt(dims[3]), causal, xs[3] if bias_shape else None)
    np.testing.assert_allclose(evaluate(g, xs)[0], want, rtol=1e-5, atol=1e-6)
    func = lower_op(g.ops[-1])
    assert attention_schedule(func, Target("cpu")) is not None  # not the generic default
    np.testing.assert_allclose(hexir.compile(g, "cpu").run(xs)[0], want, rtol=1e-5, atol=2e-6)


def test_elementwise_producers_fused_into_the_kernel_are_inlined(rng):
    """A reduction-role op, attention takes elementwise producers into its kernel (here q
    scaled); its schedule inlines them and applies."""
    g = GraphBuilder("producers")
    q, kt, v = g.input("q", (2, 40, 16)), g.input("kt", (2, 16, 64)), g.input("v", (2, 64, 32))
    two = g.constant(np.array(2.0, np.float32))
    out = g.op("attention", g.mul(q, two), kt, g.relu(v), causal=True)
    graph = g.build([out])
    _, kernels = fused_kernels(graph, "cpu")
    (func,) = [f for group, f in kernels if [op.kind for op in group.ops] == ["mul", "attention"]]
    assert attention_schedule(func, Target("cpu")) is not None
    xs = inputs(graph, rng)
    want = reference(2 * xs[0], xs[1], np.maximum(xs[2], 0), 0.25, True)
    np.testing.assert_allclose(hexir.compile(graph, "cpu").run(xs)[0], want, rtol=1e-5, atol=2e-6)


def test_the_schedule_keeps_a_jobs_scores_not_all_of_them():
    """Each job's scores are JOB_ROWS x T floats (32 x 256), declared inside the parallel loop
    (in a thread's scratch: hexir/codegen/c.py), never the whole S x T."""
    g = graph(2, 256, 256, 16, 16, True)
    sch = attention_schedule(lower_op(g.ops[-1]), Target("cpu"))
    source = hexir.build(sch.func, "cpu").source
    parallel = source.index("#pragma omp parallel")
    declared = re.search(r"attention_scores = \(float\*\)hx_scratch\(&\w+, (\d+)\)", source)
    assert declared is not None and declared.start() > parallel
    assert int(declared.group(1)) == 32 * 256 * 4


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_cuda_kernel_compiles_and_computes_numpy_on_the_cpu_path(rng, arch):
    g = graph(4, 32, 48, 16, 16, True, (32, 48))
    sch = default_schedule(lower_op(g.ops[-1]), Target(f"cuda -arch={arch}"))
    target = Target(f"cuda -arch={arch}")
    cuda = generate_cuda(sch.func, target)
    assert compile_cuda(cuda.source, target, cuda.name).resources["registers"] > 0
    xs = inputs(g, rng)
    out = np.empty((4, 32, 16), np.float32)
    hexir.build(sch.func, "cpu")(*xs, out)
    np.testing.assert_allclose(out, reference(*xs[:3], 0.25, True, xs[3]), rtol=1e-5, atol=2e-6)


def test_text_form_and_onnx_export_round_trip(rng, tmp_path):
    g = graph(2, 6, 9, 8, 4, True, (2, 6, 9), scale=0.3)
    assert parse_graph(print_graph(g)) == g
    xs = inputs(g, rng)
    path = tmp_path / "attention.onnx"
    hexir.export_onnx(g, path)
    session = onnxruntime.InferenceSession(str(path))
    (got,) = session.run(None, {v.name: x for v, x in zip(g.inputs, xs, strict=True)})
    np.testing.assert_allclose(got, reference(*xs[:3], 0.3, True, xs[3]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "q, kt, v, bias, attrs, message",
    [
        ((2, 4, 8), (2, 8, 6), (2, 5, 8), None, {}, "are not [B,S,D], [B,D,T], [B,T,Dv]"),
        ((2, 4, 8), (2, 7, 6), (2, 6, 8), None, {}, "are not [B,S,D], [B,D,T], [B,T,Dv]"),
        ((2, 4, 8), (2, 8, 6), (2, 6, 8), (3, 4, 6), {}, "does not broadcast to the scores"),
        ((2, 8, 8), (2, 8, 6), (2, 6, 8), None, {"causal": True}, "at least as many keys"),
    ],
)
def test_bad_operands_are_refused_naming_the_problem(q, kt, v, bias, attrs, message):
    g = GraphBuilder("bad")
    operands = [g.input("q", q), g.input("kt", kt), g.input("v", v)]
    if bias is not None:
        operands.append(g.input("bias", bias))
    with pytest.raises(TypeInferenceError, match=message.replace("[", r"\[")):
        g.op("attention", *operands, **attrs)
