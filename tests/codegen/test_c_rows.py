"""Row-by-row kernels in C: a job's intermediate kept in the output it ends in
(hexir/codegen/c_inplace.py) and the next rows prefetched (c_prefetch.py), each checked on
the IR it rewrites and end to end against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.codegen.c_inplace import intermediates_in_outputs
from hexir.codegen.c_prefetch import PREFETCH
from hexir.ir.tir import Allocate, Buffer, BufferStore, For, IntImm, Var, seq
from hexir.ir.visit import walk


def _job(final_index):
    """for row in 0..4 parallel { alloc t[8]; t[i] = 2 x[row, i]; out[row, j] = t[f(j)] + 1 }"""
    x, out, t = Buffer("x", (4, 8)), Buffer("out", (4, 8)), Buffer("t", (8,))
    row, i, j = Var("row"), Var("i"), Var("j")
    stage = For(i, 8, "serial", BufferStore(t, (i,), x[row, i] * 2.0))
    last = For(j, 8, "serial", BufferStore(out, (row, j), t[final_index(j)] + 1.0))
    return For(row, 4, "parallel", seq(Allocate(t), stage, last)), t, out


def _buffers(stmt):
    return {n.buffer.name for n in walk(stmt) if isinstance(n, BufferStore | Allocate)}


def test_an_intermediate_read_element_by_element_at_the_end_is_kept_in_the_output():
    body, t, out = _job(lambda j: j)
    moved = intermediates_in_outputs(body)
    assert _buffers(moved) == {"out"}  # t is gone: its stage stores into out
    stores = [n for n in walk(moved) if isinstance(n, BufferStore)]
    assert [s.buffer for s in stores] == [out, out]


def test_an_output_the_plan_may_run_over_an_input_keeps_no_intermediate():
    body, _, out = _job(lambda j: j)
    assert intermediates_in_outputs(body, {out}) == body


@pytest.mark.parametrize("index", [lambda j: IntImm(7) - j, lambda j: j * 0])
def test_an_intermediate_read_otherwise_stays_where_it_is(index):
    body, t, _ = _job(index)  # reversed, or one element for all: in place would clobber
    assert intermediates_in_outputs(body) == body


def test_softmax_rows_of_a_page_compute_in_their_output_and_prefetch_the_next(rng):
    shape = (3, 16, 1024)
    b = hexir.GraphBuilder("rows")
    graph = b.build(b.softmax(b.input("x", shape, "float32"), axis=-1))
    module = hexir.compile(graph)
    kernel = module.kernels[module.commands[0].kernel]
    assert f"{PREFETCH} = 1" in str(kernel.func)  # the schedule asks, the C does it
    assert "__builtin_prefetch" in kernel.source and "softmax_exp[" not in kernel.source
    x = rng.standard_normal(shape).astype(np.float32) * 30
    x[0, 0, :512] = -1e4  # exps that underflow to 0
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(module.run([x])[0], e / e.sum(-1, keepdims=True), atol=1e-6)


def test_short_rows_are_not_prefetched(rng):
    b = hexir.GraphBuilder("short")
    graph = b.build(b.softmax(b.input("x", (8, 128), "float32"), axis=-1))
    module = hexir.compile(graph)
    kernel = module.kernels[module.commands[0].kernel]
    assert PREFETCH not in str(kernel.func) and "__builtin_prefetch" not in kernel.source
