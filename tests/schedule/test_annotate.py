"""parallel, vectorize, unroll, bind, annotate, unannotate: kinds in place, legality."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from schedule_fixtures import ADD_2D, MATMUL, check, func, raises_unchanged

import hexir
from hexir.codegen.c import CPrinter
from hexir.ir.tir import Block, For
from hexir.ir.visit import walk
from hexir.ops.parse import parse
from hexir.runtime.target import Target
from hexir.schedule import Schedule


def loops(sch: Schedule, block: str) -> list:
    return sch.get_loops(sch.get_block(block))


def kinds(sch: Schedule) -> dict[str, str]:
    return {n.var.name: n.kind for n in walk(sch.func.body) if isinstance(n, For)}


@dataclass
class FakeTarget:
    max_threads_per_block: int


def test_parallel_vectorize_unroll_matmul() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    i, j, k = loops(sch, "matmul")
    i0, i1 = sch.split(i, [None, 8])
    j0, j1 = sch.split(j, [None, 16])
    k0, k1 = sch.split(k, [None, 4])
    sch.reorder(i0, j0, k0, i1, k1, j1)
    sch.parallel(i0)
    sch.unroll(k1)
    sch.vectorize(j1)
    assert kinds(sch) == {
        "i_0": "parallel",
        "j_0": "serial",
        "k_0": "serial",
        "i_1": "serial",
        "k_1": "unrolled",
        "j_1": "vectorized",
    }
    assert str(sch.trace).endswith(
        "sch.parallel(loop=l4)\nsch.unroll(loop=l9)\nsch.vectorize(loop=l7)"
    )
    check(sch, before)


def test_parallel_of_a_reduction_loop_is_illegal() -> None:
    sch = Schedule(func(MATMUL), seed=0)
    i, j, k = loops(sch, "matmul")
    err = raises_unchanged(sch, lambda: sch.parallel(k), "reduce iter var vk of block @matmul")
    assert err.brief().startswith("parallel: loop %k feeds reduce iter var vk")
    assert "      for %k in 0..32 serial {  <-- here" in str(err)
    # Fused with spatial loops, the reduction still flows through the fused var.
    fused = sch.fuse(j, k)
    raises_unchanged(sch, lambda: sch.parallel(fused), "reduce iter var")
    sch.parallel(i)
    raises_unchanged(sch, lambda: sch.parallel(i), "already parallel")
    raises_unchanged(sch, lambda: sch.unroll(i), "already parallel")


def test_vectorize_legality() -> None:
    before = func(ADD_2D)
    sch = Schedule(before, seed=0)
    i, j = loops(sch, "add")
    raises_unchanged(sch, lambda: sch.vectorize(i), "not innermost")
    # %B is read as %B[vj, vi]: stride 64 along axis 0 in %j.
    raises_unchanged(sch, lambda: sch.vectorize(j), r"%B\[%j, %i\] is stride 1 in %j along axis 0")
    sch.reorder(j, i)
    raises_unchanged(sch, lambda: sch.vectorize(i), r"%C\[%i, %j\] is stride 1 in %i along axis 0")
    check(sch, before)


def test_vectorize_needs_unit_stride_in_the_last_axis() -> None:
    sch = Schedule(func(MATMUL), seed=0)
    i, j, k = loops(sch, "matmul")
    sch.reorder(k, j, i)
    raises_unchanged(sch, lambda: sch.vectorize(i), r"%C\[%i, %j\] is stride 1 in %i along axis 0")
    raises_unchanged(sch, lambda: sch.vectorize(j), "not innermost")
    fresh = Schedule(func(MATMUL), seed=0)
    _, _, k = loops(fresh, "matmul")
    raises_unchanged(fresh, lambda: fresh.vectorize(k), r"%B\[%k, %j\] is stride 1 in %k")


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max"])
@pytest.mark.parametrize("n", [16, 64, 20])
def test_a_vectorized_reduction_combines_its_lanes_in_a_tree(op, n) -> None:
    # The row's loop is the reduction's: vectorized, its lanes combine by halves (hx_hsum /
    # hx_hmax in the C); 20 (no whole vectors of 16) prints as the serial loop, without
    # `omp simd` (which would race on the accumulator).
    before = hexir.workload(op, shape=(6, n), axes=(1,))
    sch = Schedule(before, seed=0)
    (block,) = [b.name for b in walk(before.body) if isinstance(b, Block)]
    k = loops(sch, block)[-1]
    sch.vectorize(k)
    assert "vectorized" in str(sch.func)
    check(sch, before)
    source = CPrinter(Target("cpu")).print_func(sch.func)
    helper = {"reduce_sum": "hsum", "reduce_max": "hmax"}[op]
    lanes = Target("cpu").vector_width
    assert (f"hx_{helper}_f32x" in source) == (n % lanes == 0)
    assert "omp simd" not in source


def test_vectorize_refuses_a_reduction_it_cannot_combine_in_a_tree() -> None:
    # A sum of products whose loop also indexes the output (a spatial iter var), or a dot
    # product with an operand strided in the loop: refused, with the reason.
    sch = Schedule(func(MATMUL), seed=0)
    i, j, k = loops(sch, "matmul")
    fused = sch.fuse(j, k)
    raises_unchanged(sch, lambda: sch.vectorize(fused), "reduce iter var")


def test_bind_gpu_matmul_with_cross_thread_reduction() -> None:
    before = func(MATMUL)
    sch = Schedule(before, target=FakeTarget(1024), seed=0)
    i, j, k = loops(sch, "matmul")
    i0, i1 = sch.split(i, [None, 16])
    sch.reorder(i0, j, i1)
    sch.bind(i0, "blockIdx.x")
    sch.bind(j, "blockIdx.y")
    sch.bind(i1, "threadIdx.y")
    sch.bind(k, "threadIdx.x")  # legal: a cross-thread reduction
    assert kinds(sch)["k"] == "threadIdx.x"
    assert 'sch.bind(loop=l3, thread_axis="threadIdx.x")' in str(sch.trace)
    check(sch, before)  # GPU-bound loops run serially on the CPU


def test_bind_illegal() -> None:
    sch = Schedule(func(MATMUL), target=FakeTarget(256), seed=0)
    i, j, k = loops(sch, "matmul")
    raises_unchanged(sch, lambda: sch.bind(k, "blockIdx.x"), "reduce iter var vk")
    raises_unchanged(sch, lambda: sch.bind(i, "threadIdx.w"), "unknown thread axis")
    sch.bind(j, "threadIdx.x")
    raises_unchanged(sch, lambda: sch.bind(i, "threadIdx.x"), "already bound to threadIdx.x")
    raises_unchanged(sch, lambda: sch.bind(k, "blockIdx.x"), "reduce iter var")
    # 48 x 64 threads exceed the target's 256.
    raises_unchanged(sch, lambda: sch.bind(i, "threadIdx.y"), "3072 threads per block")
    nested = Schedule(func(MATMUL), seed=0)
    i, j, _ = loops(nested, "matmul")
    nested.bind(i, "threadIdx.x")
    raises_unchanged(nested, lambda: nested.bind(j, "blockIdx.x"), "inside a threadIdx loop")


def test_annotate_and_unannotate() -> None:
    before = func(ADD_2D)
    sch = Schedule(before, seed=3)
    block = sch.get_block("add")
    i, j = sch.get_loops(block)
    step = sch.sample_categorical([0, 16, 64], [0.2, 0.3, 0.5], decision=1)
    sch.annotate(i, "pragma_auto_unroll_max_step", step)
    sch.annotate(block, "meta_schedule.tiling", "SSRSRS")
    sch.annotate(block, "stage", [1, 2])
    assert sch.func == parse("""\
hextir.func @add(%A: buffer<64x48xf32>, %B: buffer<48x64xf32>, %C: buffer<64x48xf32>) {
  for %i in 0..64 serial attributes {pragma_auto_unroll_max_step = 16} {
    for %j in 0..48 serial {
      block @add(vi = spatial(64) %i, vj = spatial(48) %j) reads(%A[vi, vj], %B[vj, vi]) writes(%C[vi, vj]) attributes {meta_schedule.tiling = "SSRSRS", stage = (1, 2)} {
        %C[vi, vj] = %A[vi, vj] + %B[vj, vi]
      }
    }
  }
}""")  # noqa: E501
    assert 'sch.annotate(block_or_loop=l1, key="pragma_auto_unroll_max_step", value=v3)' in str(
        sch.trace
    )
    check(sch, before)
    # The annotation follows a changed decision on replay.
    ((index, _),) = sch.trace.decisions
    replayed = sch.trace.with_decision(index, 2).apply(before)
    (outer,) = [n for n in walk(replayed.func.body) if isinstance(n, For) and n.var.name == "i"]
    assert outer.annotations == (("pragma_auto_unroll_max_step", 64),)
    sch.unannotate(block, "stage")
    sch.unannotate(i, "pragma_auto_unroll_max_step")
    (b,) = [n for n in walk(sch.func.body) if isinstance(n, Block)]
    assert b.annotations == (("meta_schedule.tiling", "SSRSRS"),)
    raises_unchanged(sch, lambda: sch.unannotate(i, "pragma_auto_unroll_max_step"), "no annotation")
    raises_unchanged(sch, lambda: sch.annotate(i, "x", {"a": 1}), "an annotation is")
    check(sch, before, numerics=False)
