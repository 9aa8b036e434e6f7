"""The integer dtypes beyond int32/int64 (int8, int16, uint8, uint16, uint32, uint64) end to
end: arithmetic that wraps as numpy's does (also inside a fused kernel, where C would compute
narrow integers as int), casts between every pair of dtypes, reductions, selects, constants at
the ends of each range, the text forms, and CUDA C that NVRTC compiles."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.codegen.cuda import generate_cuda
from hexir.graph.evaluate import evaluate
from hexir.graph.lower import lower_op
from hexir.ir.dtype import wrap_int
from hexir.ir.graph_text import print_graph
from hexir.ir.tir import Cast, IntImm
from hexir.ir.tir_parse import parse_func
from hexir.ir.tir_text import print_func
from hexir.ops.parse import parse_graph
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule.handwritten import gpu_schedule

NARROW = ["int8", "int16", "uint8", "uint16", "uint32", "uint64"]
SHAPE = (3, 37)  # 37: a vector body and a scalar tail


def full_range(rng: np.random.Generator, dtype: str, shape=SHAPE) -> np.ndarray:
    """Values over the dtype's whole range, its two ends included."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x.flat[:2] = info.min, info.max
    return x


def compiled_matches_numpy(graph: hexir.Graph, feeds: dict[str, np.ndarray], want: np.ndarray):
    for got in (evaluate(graph, feeds)[0], hexir.compile(graph).run(feeds)[0]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize(
    "op, fn",
    [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("maximum", np.maximum),
     ("minimum", np.minimum), ("less", np.less), ("equal", np.equal)],
)  # fmt: skip
def test_binaries_over_the_whole_range_wrap_as_numpy(rng, dtype, op, fn):
    b = hexir.GraphBuilder("t")
    graph = b.build(b.op(op, b.input("x", SHAPE, dtype), b.input("y", SHAPE, dtype)))
    x, y = full_range(rng, dtype), full_range(rng, dtype)
    with np.errstate(over="ignore"):
        compiled_matches_numpy(graph, {"x": x, "y": y}, fn(x, y))


@pytest.mark.parametrize("dtype", NARROW)
def test_a_fused_sum_wraps_before_it_is_compared(rng, dtype):
    """(x + y) * x > z in one kernel: each product and sum wraps in the dtype, not in C's int."""
    b = hexir.GraphBuilder("t")
    x, y, z = (b.input(n, SHAPE, dtype) for n in "xyz")
    graph = b.build(b.greater(b.mul(b.add(x, y), x), z))
    module = hexir.compile(graph)
    assert len(module.commands) == 1
    feeds = {n: full_range(rng, dtype) for n in "xyz"}
    want = (feeds["x"] + feeds["y"]) * feeds["x"] > feeds["z"]
    compiled_matches_numpy(graph, feeds, want)


@pytest.mark.parametrize("dtype", NARROW)
def test_division_reductions_argmax_and_where(rng, dtype):
    x = full_range(rng, dtype)
    d = rng.integers(1, 100, SHAPE).astype(dtype)
    b = hexir.GraphBuilder("t")
    xv, dv = b.input("x", SHAPE, dtype), b.input("d", SHAPE, dtype)
    outs = [
        b.div(xv, dv),
        b.reduce_max(xv, axes=(1,)),
        b.argmax(xv, axis=1),
        b.where(b.less(xv, dv), dv, xv),
        b.reduce_sum(xv, axes=(1,)),
    ]
    graph = b.build(outs)
    big = x.astype(object)  # Python ints: exact; C's division truncates toward zero
    quotient = np.where(big < 0, -(-big // d.astype(object)), big // d.astype(object))
    quotient = quotient.astype(dtype)
    with np.errstate(over="ignore"):
        wants = [quotient, x.max(1), x.argmax(1), np.where(x < d, d, x), x.sum(1, dtype=dtype)]
    for got in (evaluate(graph, {"x": x, "d": d}), hexir.compile(graph).run({"x": x, "d": d})):
        for g, w in zip(got, wants, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("source", NARROW)
def test_casts_to_and_from_every_dtype(rng, source):
    x = full_range(rng, source)
    for target in [*NARROW, "int32", "int64", "float32", "float64", "bool"]:
        b = hexir.GraphBuilder("t")
        graph = b.build(b.cast(b.input("x", SHAPE, source), target))
        compiled_matches_numpy(graph, {"x": x}, x.astype(target))
    f = rng.uniform(-100, 100, SHAPE).astype(np.float32)
    f = np.abs(f) if source.startswith("u") else f
    b = hexir.GraphBuilder("t")
    graph = b.build(b.cast(b.input("f", SHAPE, "float32"), source))
    compiled_matches_numpy(graph, {"f": f}, f.astype(source))  # in range: C truncates as numpy


@pytest.mark.parametrize("dtype", NARROW)
def test_constants_at_the_ends_of_the_range(rng, dtype):
    info = np.iinfo(dtype)
    c = np.array([info.min, info.max, info.max // 3], dtype)
    b = hexir.GraphBuilder("t")
    graph = b.build(b.maximum(b.input("x", (3,), dtype), b.constant(c)))
    x = full_range(rng, dtype, (3,))
    compiled_matches_numpy(graph, {"x": x}, np.maximum(x, c))
    assert hexir.compile(graph).run({"x": x})[0].dtype == dtype


def test_wrap_int_is_twos_complement():
    assert wrap_int(200, "int8") == -56 and wrap_int(-1, "uint8") == 255
    assert wrap_int(2**64 + 5, "uint64") == 5 and wrap_int(-(2**15) - 1, "int16") == 2**15 - 1
    assert Cast("uint8", IntImm(-1, "int32")).dtype == "uint8"


def test_the_text_forms_round_trip():
    text = (
        "hexir.graph @t(%x: tensor<2x3xu8>, %y: tensor<2x3xi16>) -> tensor<2x3xu8> {\n"
        '  %0 = hexir.cast %y {dtype = "uint8"} : tensor<2x3xu8>\n'
        "  %1 = hexir.add %x, %0 : tensor<2x3xu8>\n"
        "  hexir.return %1\n"
        "}"
    )
    graph = parse_graph(text)
    assert graph.outputs[0].type.dtype == "uint8"
    assert parse_graph(print_graph(graph)) == graph
    b = hexir.GraphBuilder("t")
    big = b.constant(np.uint64(2**63))
    func = lower_op(b.build(b.add(b.input("x", (4,), "uint64"), big)).ops[-1])
    assert parse_func(print_func(func)) == func


@pytest.mark.parametrize("dtype", NARROW)
def test_cuda_c_of_each_dtype_compiles_with_nvrtc(dtype):
    b = hexir.GraphBuilder("t")
    x, y = b.input("x", (64, 128), dtype), b.input("y", (64, 128), dtype)
    graph = b.build(b.reduce_max(b.mul(x, y), axes=(1,)))
    for op in graph.ops:
        func = lower_op(op)
        target = Target("cuda -arch=sm_90")
        cuda = generate_cuda(gpu_schedule(func).func, target)
        compile_cuda(cuda.source, target, cuda.name)
