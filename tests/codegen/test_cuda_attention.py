"""The attention op's GPU kernel, the flash nest (hexir/schedule/flash.py), without a GPU: its
CUDA compiles with NVRTC for sm_80 and sm_90, holds its tiles in shared memory and no buffer
of queries x keys, and the same schedule run on the CPU path (GPU loops serial) computes
numpy's answer, causal or not, with tiles that do not divide the queries or the keys."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.cuda import generate_cuda
from hexir.codegen.gpu_analyze import analyze
from hexir.graph.lower import lower
from hexir.ir.tir import Allocate
from hexir.ir.visit import walk
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule.flash_nest import Tiles
from hexir.schedule.handwritten_attention import KEY_TILES, LANES, QUERY_TILES

HEAD = 64


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def _attention(s: int, t: int, causal: bool, bias: bool = False) -> hexir.PrimFunc:
    b = hexir.GraphBuilder("attention")
    operands = [b.input("q", (2, s, HEAD)), b.input("kt", (2, HEAD, t)), b.input("v", (2, t, HEAD))]
    if bias:
        operands.append(b.input("mask", (2, 1, t)))
    return lower(b.build(b.attention(*operands, causal=causal)))


def _inputs(func: hexir.PrimFunc, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(b.shape).astype(np.float32) for b in func.inputs]


def _on_cpu(scheduled: hexir.PrimFunc, inputs: list[np.ndarray]) -> np.ndarray:
    out = np.full(scheduled.outputs[0].shape, np.nan, np.float32)
    hexir.build(scheduled, "cpu")(*inputs, out)
    return out


def _largest_buffer(func: hexir.PrimFunc) -> int:
    return max(n.buffer.size for n in walk(func.body) if isinstance(n, Allocate))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_flash_kernel_compiles_with_nvrtc_in_shared_memory_and_no_scores(arch):
    s = t = 100
    func = _attention(s, t, causal=True)
    target = Target(f"cuda -arch={arch}")
    sch = default_schedule(func, target)
    assert "flash_attention" in str(sch.trace)
    assert hexir.Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func
    assert _largest_buffer(func) >= s * t  # the op's own stages hold the scores...
    assert _largest_buffer(sch.func) < s * t  # ...the flash nest holds tiles only
    cuda = generate_cuda(sch.func, target)
    assert cuda.block == (2, 64, 1) and cuda.grid == (2, 2, 1)
    arrays = [int(n) for n in re.findall(r"\bfloat \w+\[(\d+)\];", cuda.source)]
    assert "__shared__" in cuda.source and max(arrays) < s * t
    binary = compile_cuda(cuda.source, target, cuda.name)
    assert binary.arch == arch and binary.resources["spill_bytes"] == 0
    assert 0 < binary.resources["shared_bytes"] <= 48 * 1024
    report = analyze(hexir.build(sch.func, target))
    assert report.conflict_free, report


@pytest.mark.parametrize(
    "s, t, causal, bias",
    [
        (100, 100, True, False),
        (100, 100, False, False),
        (37, 100, True, False),
        (37, 100, False, True),
    ],
)
def test_the_flash_schedule_computes_numpy_on_the_cpu(s, t, causal, bias, rng):
    """Tiles of 64 that divide neither the queries nor the keys; causal attention of fewer
    queries than keys sees them bottom-right aligned (query i sees keys up to i + 63)."""
    func = _attention(s, t, causal, bias)
    sch = default_schedule(func, Target("cuda -arch=sm_90"))
    assert "flash_attention" in str(sch.trace)
    inputs = _inputs(func, rng)
    if bias:  # a mask hiding the first 70 keys (a whole tile: its max is -inf)
        inputs[3][..., :70] = -np.inf
    (want,) = hexir.reference(func, inputs)
    np.testing.assert_allclose(_on_cpu(sch.func, inputs), want, rtol=1e-4, atol=1e-5)


def test_tiles_changed_in_the_trace_compile_and_compute_numpy(rng):
    func = _attention(37, 100, causal=True)
    trace = default_schedule(func, Target("cuda -arch=sm_90")).trace
    choices = [n for n, inst in enumerate(trace.instructions) if inst.kind == "sample_categorical"]
    assert len(choices) == 3  # query rows, keys, lanes
    tiles = Tiles(queries=16, keys=32, lanes=4)
    for n, (value, candidates) in zip(
        choices, [(16, QUERY_TILES), (32, KEY_TILES), (4, LANES)], strict=True
    ):
        trace = trace.with_decision(n, candidates.index(value))
    sch = trace.apply(func)
    for arch in ("sm_80", "sm_90"):
        target = Target(f"cuda -arch={arch}")
        cuda = generate_cuda(sch.func, target)
        assert cuda.block == (tiles.lanes, tiles.queries, 1) and cuda.grid == (3, 2, 1)
        compile_cuda(cuda.source, target, cuda.name)
    inputs = _inputs(func, rng)
    (want,) = hexir.reference(func, inputs)
    np.testing.assert_allclose(_on_cpu(sch.func, inputs), want, rtol=1e-4, atol=1e-5)


def test_causal_attention_skips_the_key_tiles_a_block_hides(rng):
    """Keys 64..127 are hidden from queries 0..63: their block never reads their values (NaN
    here), so those rows stay finite and right; a block that read them would multiply a
    hidden key's exp, 0, by NaN."""
    func = _attention(128, 128, causal=True)
    sch = default_schedule(func, Target("cuda -arch=sm_90"))
    inputs = _inputs(func, rng)
    (want,) = hexir.reference(func, inputs)
    inputs[2][:, 64:] = np.nan
    got = _on_cpu(sch.func, inputs)
    np.testing.assert_allclose(got[:, :64], want[:, :64], rtol=1e-4, atol=1e-5)
    assert np.isnan(got[:, 64:]).all()  # the next block sees them: NaN in, NaN out


def test_elementwise_producers_fused_into_the_kernel_are_inlined_into_the_nest(rng):
    """Attention takes elementwise producers into its kernel (a scaled query, relu of the
    values); the flash schedule inlines them into its tiles' copies and its query row."""
    from hexir.graph.fusion import fused_kernels

    g = hexir.GraphBuilder("producers")
    q, kt, v = (
        g.input("q", (2, 40, HEAD)),
        g.input("kt", (2, HEAD, 72)),
        g.input("v", (2, 72, HEAD)),
    )
    two = g.constant(np.array(2.0, np.float32))
    graph = g.build([g.op("attention", g.mul(q, two), kt, g.relu(v), causal=True)])
    _, kernels = fused_kernels(graph, "cuda")
    (func,) = [f for group, f in kernels if "attention" in [op.kind for op in group.ops]]
    sch = default_schedule(func, Target("cuda -arch=sm_90"))
    assert "flash_attention" in str(sch.trace)
    inputs = _inputs(func, rng)
    (want,) = hexir.reference(func, inputs)
    np.testing.assert_allclose(_on_cpu(sch.func, inputs), want, rtol=1e-4, atol=1e-5)
