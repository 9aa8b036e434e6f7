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
from hexir.schedule.handwritten_attention import ROWS

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


# sm_90 and one causal case in the quick suite; the other archs and cases in the slow one
@pytest.mark.parametrize("arch", [pytest.param("sm_80", marks=pytest.mark.slow), "sm_90"])
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
    # its inner loop is the scores' dot product over the depth (a key from shared memory,
    # the query row in registers), not the output stage it once read (1-6% of peak): 32 FMAs
    # against 32 scalar shared loads a depth step, the keys of a lane being 2 apart
    assert report.fma_clocks == 32 * 32 / 128 and report.memory_clocks == 32, report
    assert 0.2 <= report.predicted <= 0.3, report


@pytest.mark.parametrize(
    "s, t, causal, bias",
    [
        (100, 100, True, False),
        pytest.param(100, 100, False, False, marks=pytest.mark.slow),
        pytest.param(37, 100, True, False, marks=pytest.mark.slow),
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


@pytest.mark.slow
def test_tiles_changed_in_the_trace_compile_and_compute_numpy(rng):
    func = _attention(37, 100, causal=True)
    trace = default_schedule(func, Target("cuda -arch=sm_90")).trace
    choices = [n for n, inst in enumerate(trace.instructions) if inst.kind == "sample_categorical"]
    assert len(choices) == 3  # query rows, keys, lanes
    tiles = Tiles(queries=16, keys=32, lanes=4)
    for n, (value, candidates) in zip(
        choices, [(16, ROWS.queries), (32, ROWS.keys), (4, ROWS.lanes)], strict=True
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


@pytest.mark.slow  # 1.7 s: the quick suite stays under 3 minutes
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


@pytest.mark.slow
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


# --- decode over the paged KV cache -----------------------------------------------------------

PAGES, SLOTS, ROW = 20, 16, 8  # pages in the pool, slots a page, pages a sequence's table row


def _paged(new: bool) -> hexir.PrimFunc:
    b = hexir.GraphBuilder("paged")
    operands = [
        b.input("q", (2, 2, HEAD)),
        b.input("k_pages", (PAGES, 2, SLOTS, HEAD)),
        b.input("v_pages", (PAGES, 2, SLOTS, HEAD)),
        b.input("block_table", (2, ROW), "int32"),
        b.input("lengths", (2,), "int32"),
    ]
    if new:
        operands += [b.input("k_new", (2, 2, HEAD)), b.input("v_new", (2, 2, HEAD))]
    return lower(b.build(b.paged_attention(*operands)))


def _paged_inputs(func: hexir.PrimFunc, lengths: list[int], rng) -> list[np.ndarray]:
    """Random pages, the last of them NaN; each sequence's table row names distinct random
    pages for its tiles of 64 keys that it sees at all, and the NaN page past them: a tile
    the kernel read past the length would make its output NaN (exp 0 times NaN)."""
    q, kp, vp, _, _, *new = _inputs(func, rng)
    kp[-1], vp[-1] = np.nan, np.nan
    table = np.full((2, ROW), PAGES - 1, np.int32)
    for row, n in zip(table, lengths, strict=True):
        used = -(-(n + len(new) // 2) // 64) * 64 // SLOTS  # whole tiles of 64 keys
        row[:used] = rng.choice(PAGES - 1, used, replace=False)
    return [q, kp, vp, table, np.array(lengths, np.int32), *new]


@pytest.mark.parametrize(
    "new, lengths",
    [
        pytest.param(False, [37, 100], marks=pytest.mark.slow),
        pytest.param(True, [0, 70], marks=pytest.mark.slow),  # 2.3 s each
    ],
)
def test_decode_over_the_paged_cache_is_the_flash_nest_of_one_query(new, lengths, rng):
    """One thread block per (sequence, head); the current token, where given, is the key
    after the cached ones; tiles past a sequence's length are not read."""
    func = _paged(new)
    sch = default_schedule(func, Target("cuda -arch=sm_90"))
    assert "flash_attention" in str(sch.trace)
    assert not any(
        n.buffer.name.startswith("paged_") for n in walk(sch.func.body) if isinstance(n, Allocate)
    )
    for arch in ("sm_80", "sm_90"):
        target = Target(f"cuda -arch={arch}")
        cuda = generate_cuda(sch.func, target)
        assert cuda.grid == (1, 4, 1) and cuda.block == (32, 1, 1)
        binary = compile_cuda(cuda.source, target, cuda.name)
        assert binary.resources["spill_bytes"] == 0
    inputs = _paged_inputs(func, lengths, rng)
    (want,) = hexir.reference(func, inputs)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(_on_cpu(sch.func, inputs), want, rtol=1e-4, atol=1e-5)
