"""decompose_reduction, rfactor: expected IR, trace round trips, replay, numerics, illegal uses."""

from __future__ import annotations

import numpy as np
import pytest
from schedule_fixtures import MATMUL, check, func, raises_unchanged

import hexir
import hexir.schedule.schedule
from hexir.ir.tir import Block, FloatImm, PrimFunc
from hexir.ops.parse import parse
from hexir.schedule.reduction import identity
from hexir.schedule.schedule import Schedule


def loops(sch: Schedule, block: str) -> list:
    return sch.get_loops(sch.get_block(block))


def block_names(f: PrimFunc) -> list[str]:
    from hexir.ir.visit import walk

    return [n.name for n in walk(f.body) if isinstance(n, Block)]


# ---------------------------------------------------------------------------------------------
# decompose_reduction


def test_decompose_matmul_at_k() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    block = sch.get_block("matmul")
    _, _, k = sch.get_loops(block)
    init = sch.decompose_reduction(block, k)
    assert str(init) == "matmul_init"
    assert sch.func == parse("""\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  for %i in 0..64 serial {
    for %j in 0..48 serial {
      block @matmul_init(vi = spatial(64) %i, vj = spatial(48) %j) reads() writes(%C[vi, vj]) {
        %C[vi, vj] = 0.0
      }
      for %k in 0..32 serial {
        block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k) reads(%A[vi, vk], %B[vk, vj]) writes(%C[vi, vj]) {
          %C[vi, vj] = %C[vi, vj] + %A[vi, vk] * %B[vk, vj]
        }
      }
    }
  }
}""")  # noqa: E501
    assert "b4 = sch.decompose_reduction(block=b0, loop=l3)" in str(sch.trace)
    check(sch, before)


def test_decompose_matmul_at_split_k_outer_of_a_cpu_tiling() -> None:
    # The fast CPU matmul: register tile (i_1, j_1) inside k, accumulator initialized outside k.
    before = hexir.workload("matmul", M=32, N=32, K=24)
    sch = Schedule(before, seed=0)
    block = sch.get_block("matmul")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 8])
    k0, k1 = sch.split(k, [None, 4])
    sch.reorder(i0, j0, k0, k1, i1, j1)
    sch.decompose_reduction(block, k0)
    sch.vectorize(j1)
    sch.parallel(i0)
    body = str(sch.func)
    # The init nest copies the register tile loops, kinds included, right before %k0_0.
    assert body.index("for %i0_1_init in 0..4 serial") < body.index("for %k0_0 in 0..6")
    assert "for %i1_1_init in 0..8 vectorized" not in body  # vectorize came after decomposing
    check(sch, before)


def test_decompose_at_an_outer_loop_copies_the_spatial_loops() -> None:
    before = hexir.workload("conv2d", N=1, C=3, H=6, W=6, K=4, R=3, S=3)
    sch = Schedule(before, seed=0)
    block = sch.get_block("conv2d")
    n, c, h, w, *_ = sch.get_loops(block)
    sch.decompose_reduction(block, c)
    text = str(sch.func)
    for name in ("i1_init", "i2_init", "i3_init"):
        assert f"for %{name} in" in text
    assert "for %i0_init" not in text  # above the decomposition point: shared
    assert block_names(sch.func) == ["conv2d_init", "conv2d"]
    check(sch, before)


def test_decompose_under_a_non_dividing_split_keeps_the_spatial_guard() -> None:
    before = hexir.workload("matmul", M=10, N=8, K=12)
    sch = Schedule(before, seed=0)
    block = sch.get_block("matmul")
    i, _, k = sch.get_loops(block)
    i0, _ = sch.split(i, [None, 4])
    k0, _ = sch.split(k, [None, 5])
    sch.decompose_reduction(block, i0)
    (init,) = [b for b in _blocks(sch.func) if b.name == "matmul_init"]
    assert str(init.predicate) == "%i0_0_init * 4 + %i0_1_init < 10"  # the k guard is dropped
    check(sch, before)


def test_decompose_layer_norm_and_softmax() -> None:
    for name, blocks in [
        ("layer_norm", ["layer_norm_mean", "layer_norm_var"]),
        ("softmax", ["softmax_max", "softmax_sum"]),
    ]:
        before = hexir.workload(name, M=6, N=20)
        sch = Schedule(before, seed=0)
        for b in blocks:
            rv = sch.get_block(b)
            sch.decompose_reduction(rv, sch.get_loops(rv)[0])
        check(sch, before)


def test_decompose_illegal() -> None:
    sch = Schedule(hexir.workload("softmax", M=4, N=16), seed=0)
    exp = sch.get_block("softmax_exp")
    mx = sch.get_block("softmax_max")
    other = sch.get_loops(exp)[0]
    raises_unchanged(sch, lambda: sch.decompose_reduction(exp, other), "no init")
    err = raises_unchanged(sch, lambda: sch.decompose_reduction(mx, other), "not an ancestor")
    assert "for %i1 in 0..4 serial {  <-- here" in str(err)

    sch = Schedule(func(MATMUL), seed=0)
    block = sch.get_block("matmul")
    _, _, k = sch.get_loops(block)
    k0, k1 = sch.split(k, [None, 4])
    # Below the outermost reduction loop the init would run once per %k_0.
    raises_unchanged(sch, lambda: sch.decompose_reduction(block, k1), "above loop %k_1")
    raises_unchanged(sch, lambda: sch.decompose_reduction(block, k), "no longer exists")
    sch.decompose_reduction(block, k0)
    raises_unchanged(sch, lambda: sch.decompose_reduction(block, k1), "no init")


SUM_THEN_COPY = """\
hextir.func @two(%A: buffer<8x8xf32>, %C: buffer<8xf32>, %D: buffer<8xf32>) {
  for %i in 0..8 serial {
    block @pre(vi1 = spatial(8) %i) reads() writes(%C[vi1]) {
      %C[vi1] = 5.0
    }
    for %k in 0..8 serial {
      block @sum(vi = spatial(8) %i, vk = reduce(8) %k) reads(%A[vi, vk]) writes(%C[vi]) {
        init {
          %C[vi] = 0.0
        }
        %C[vi] = %C[vi] + %A[vi, vk]
      }
    }
    block @copy(vi2 = spatial(8) %i) reads(%C[vi2]) writes(%D[vi2]) {
      %D[vi2] = %C[vi2] * 2.0
    }
  }
}"""  # noqa: E501


def test_decompose_refuses_a_loop_shared_with_another_writer() -> None:
    two = func(SUM_THEN_COPY)
    before = PrimFunc(two.name, two.params, two.body, num_outputs=2)
    sch = Schedule(before, seed=0)
    block = sch.get_block("sum")
    i, k = sch.get_loops(block)
    # The init before %i would run before @pre's store, which it used to overwrite.
    raises_unchanged(
        sch, lambda: sch.decompose_reduction(block, i), "@pre under loop %i also writes"
    )
    sch.decompose_reduction(block, k)
    check(sch, before)
    # A reader alone is fine: it sees only finished elements either way.
    no_pre = func(SUM_THEN_COPY.replace("5.0", "%A[vi1, 0]").replace("%C[vi1]", "%D[vi1]"))
    before = PrimFunc(no_pre.name, no_pre.params, no_pre.body, num_outputs=2)
    sch = Schedule(before, seed=0)
    block = sch.get_block("sum")
    i, _ = sch.get_loops(block)
    sch.decompose_reduction(block, i)
    check(sch, before)


# ---------------------------------------------------------------------------------------------
# rfactor


def test_rfactor_matmul_split_k() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    block = sch.get_block("matmul")
    _, _, k = sch.get_loops(block)
    _, k1 = sch.split(k, [None, 4])
    rf = sch.rfactor(k1, 0)
    assert str(rf) == "matmul_rf" and str(block) == "matmul"
    assert sch.func == parse("""\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  alloc %C_rf: buffer<4x64x48xf32>
  for %i in 0..64 serial {
    for %j in 0..48 serial {
      for %k_0 in 0..8 serial {
        for %k_1 in 0..4 serial {
          block @matmul_rf(vi = spatial(64) %i, vj = spatial(48) %j, vk_1 = spatial(4) %k_1, vk_0 = reduce(8) %k_0) reads(%A[vi, vk_0 * 4 + vk_1], %B[vk_0 * 4 + vk_1, vj]) writes(%C_rf[vk_1, vi, vj]) {
            init {
              %C_rf[vk_1, vi, vj] = 0.0
            }
            %C_rf[vk_1, vi, vj] = %C_rf[vk_1, vi, vj] + %A[vi, vk_0 * 4 + vk_1] * %B[vk_0 * 4 + vk_1, vj]
          }
        }
      }
      for %k_1_wb in 0..4 serial {
        block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk_1 = reduce(4) %k_1_wb) reads(%C_rf[vk_1, vi, vj]) writes(%C[vi, vj]) {
          init {
            %C[vi, vj] = 0.0
          }
          %C[vi, vj] = %C[vi, vj] + %C_rf[vk_1, vi, vj]
        }
      }
    }
  }
}""")  # noqa: E501
    assert "b6 = sch.rfactor(loop=l5, factor_axis=0)" in str(sch.trace)
    check(sch, before)


def test_rfactor_outer_split_loop_reordered_above_spatial_loops() -> None:
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    block = sch.get_block("matmul")
    i, j, k = sch.get_loops(block)
    k0, _ = sch.split(k, [4, None])
    sch.reorder(i, k0, j)
    sch.rfactor(k0, -1)
    # The write-back follows %k_0 under %i, with copies of %k_0 and %j in their order.
    _, wb_nest = _loop(sch.func, "i").body.stmts
    assert str(wb_nest).startswith("for %k_0_wb in 0..4 serial {\n  for %j_wb in 0..48 serial")
    assert sch.func.body.stmts[0].buffer.shape == (64, 48, 4)  # factor_axis -1: last
    check(sch, before)


def test_rfactor_reduce_sum_then_vectorize_and_parallel() -> None:
    before = hexir.workload("reduce_sum", M=8, N=64)
    sch = Schedule(before, seed=0)
    i, k = loops(sch, "reduce_sum")
    _, k1 = sch.split(k, [None, 8])
    sch.rfactor(k1, 1)
    # %k0_1 now feeds a spatial iter var of the rfactor block only: it may vectorize.
    sch.vectorize(k1)
    sch.parallel(i)
    check(sch, before)


def test_rfactor_gpu_cross_thread_runs_on_the_cpu() -> None:
    before = hexir.workload("reduce_sum", M=8, N=100)
    sch = Schedule(before, seed=0)
    i, k = loops(sch, "reduce_sum")
    _, k1 = sch.split(k, [None, 32])
    sch.bind(k1, "threadIdx.x")  # a cross-thread reduction, then factored
    rf = sch.rfactor(k1, 0)
    sch.bind(i, "blockIdx.x")  # legal now: %i feeds only spatial iter vars
    assert str(rf) == "reduce_sum_rf"
    assert "for %k0_1 in 0..32 threadIdx.x" in str(sch.func)
    check(sch, before)


def test_rfactor_non_dividing_split_guards_the_write_back() -> None:
    before = hexir.workload("reduce_sum", M=4, N=10)
    sch = Schedule(before, seed=0)
    _, k = loops(sch, "reduce_sum")
    _, k1 = sch.split(k, [None, 16])
    sch.rfactor(k1, 1)
    wb = next(b for b in _blocks(sch.func) if b.name == "reduce_sum")
    assert str(wb.predicate) == "%k0_1_wb < 10"  # only the partials that were filled
    check(sch, before)


def test_rfactor_softmax_max_and_sum() -> None:
    before = hexir.workload("softmax", M=6, N=48)
    sch = Schedule(before, seed=0)
    for name in ("softmax_max", "softmax_sum"):
        _, k = loops(sch, name)
        _, k1 = sch.split(k, [None, 16])
        sch.rfactor(k1, 0)
    text = str(sch.func)
    assert "%softmax_max_rf[vk0_1, vi0] = -inf" in text  # max starts from its identity
    assert "alloc %softmax_sum_rf: buffer<16x6xf32>" in text
    check(sch, before)


def test_rfactor_layer_norm() -> None:
    before = hexir.workload("layer_norm", M=5, N=24)
    sch = Schedule(before, seed=0)
    for name in ("layer_norm_mean", "layer_norm_var"):
        i, k = loops(sch, name)
        k0, _ = sch.split(k, [3, None])
        sch.rfactor(k0, 1)
    check(sch, before)


def test_rfactor_conv2d_unsplit_channel_loop_keeps_iter_var_names() -> None:
    before = hexir.workload("conv2d", N=1, C=4, H=5, W=5, K=2, R=3, S=3)
    sch = Schedule(before, seed=0)
    *_, c, _, _ = loops(sch, "conv2d")
    sch.rfactor(c, 0)
    (rf,) = [b for b in _blocks(sch.func) if b.name == "conv2d_rf"]
    kinds = [(iv.var.name, iv.kind) for iv in rf.iter_vars]
    assert kinds[4:] == [("vk0", "spatial"), ("vk1", "reduce"), ("vk2", "reduce")]
    check(sch, before)


@pytest.mark.parametrize(
    ("op", "init", "dtype"),
    [("*", "1.0", "f32"), ("min", "inf", "f32"), ("max", "-2147483648", "i32"), ("+", "3", "i32")],
)
def test_rfactor_other_combiners_and_dtypes(
    op: str, init: str, dtype: str, rng: np.random.Generator
) -> None:
    update = f"{op}(%X[vi, vk], %Y[vi])" if op in ("min", "max") else f"%X[vi, vk] {op} %Y[vi]"
    if dtype == "f32" and op == "*":
        update = "(%X[vi, vk] * 0.125 + 1.0) * %Y[vi]"  # rhs before out: either order works
    before = parse(f"""\
hextir.func @red(%X: buffer<4x24x{dtype}>, %Y: buffer<4x{dtype}>) {{
  for %i in 0..4 serial {{
    for %k in 0..24 serial {{
      block @red(vi = spatial(4) %i, vk = reduce(24) %k) reads(%X[vi, vk]) writes(%Y[vi]) {{
        init {{
          %Y[vi] = {init}
        }}
        %Y[vi] = {update}
      }}
    }}
  }}
}}""")
    assert isinstance(before, PrimFunc)
    sch = Schedule(before, seed=0)
    _, k = loops(sch, "red")
    _, k1 = sch.split(k, [None, 6])
    sch.rfactor(k1, 1)
    if dtype == "f32":
        check(sch, before)
        return
    check(sch, before, numerics=False)  # the shared check draws floats; ints need their own
    x = rng.integers(-1000, 1000, (4, 24), dtype=np.int32)
    # Poisoned: zeros would hide a missing init of max (or of any combiner of values > 0).
    outs = [np.full(4, np.iinfo(np.int32).max, np.int32) for _ in range(2)]
    for f, out in zip((before, sch.func), outs, strict=True):
        hexir.build(f, "cpu")(x, out)
    np.testing.assert_array_equal(outs[1], outs[0])


def test_identity_elements() -> None:
    assert str(identity("max", "float32")) == "-inf"
    assert str(identity("min", "int32")) == "2147483647"
    assert identity("*", "float64") == FloatImm(1.0, "float64")


def test_rfactor_illegal() -> None:
    sch = Schedule(func(MATMUL), seed=0)
    block = sch.get_block("matmul")
    i, j, k = sch.get_loops(block)
    err = raises_unchanged(sch, lambda: sch.rfactor(i, 0), "feeds no reduce iter var")
    assert "for %i in 0..64 serial {  <-- here" in str(err)
    raises_unchanged(sch, lambda: sch.rfactor(k, 3), "factor_axis 3 out of range")
    raises_unchanged(sch, lambda: sch.rfactor(k, -4), "out of range")
    fused = sch.fuse(j, k)
    raises_unchanged(sch, lambda: sch.rfactor(fused, 0), "both spatial and reduce")

    sch = Schedule(func(MATMUL), seed=0)
    block = sch.get_block("matmul")
    i, _, k = sch.get_loops(block)
    sch.decompose_reduction(block, k)
    raises_unchanged(sch, lambda: sch.rfactor(i, 0), "exactly one block")
    raises_unchanged(sch, lambda: sch.rfactor(k, 0), "no init")


def test_rfactor_refuses_an_unknown_combiner() -> None:
    text = MATMUL.replace("%C[vi, vj] + %A", "%C[vi, vj] - %A")
    sch = Schedule(func(text), seed=0)
    *_, k = loops(sch, "matmul")
    raises_unchanged(sch, lambda: sch.rfactor(k, 0), "not `out = out OP expr`")
    # The output on both sides of the combiner is not a reduction either.
    text = MATMUL.replace("%A[vi, vk] * %B[vk, vj]", "%C[vi, vj] * %B[vk, vj]")
    sch = Schedule(func(text), seed=0)
    *_, k = loops(sch, "matmul")
    raises_unchanged(sch, lambda: sch.rfactor(k, 0), "expr free of out")


def test_rfactor_refuses_a_predicate_that_hides_the_filled_partials() -> None:
    # Whether partial %k_1 is ever filled depends on %k_0 the wrong way round.
    before = func("""\
hextir.func @sum(%X: buffer<4x16xf32>, %Y: buffer<4xf32>) {
  for %i in 0..4 serial {
    for %k_0 in 0..4 serial {
      for %k_1 in 0..4 serial {
        block @sum(vi = spatial(4) %i, vk = reduce(16) %k_0 * 4 + %k_1) reads(%X[vi, vk]) writes(%Y[vi]) where %k_1 - %k_0 < 2 {
          init {
            %Y[vi] = 0.0
          }
          %Y[vi] = %Y[vi] + %X[vi, vk]
        }
      }
    }
  }
}""")  # noqa: E501
    sch = Schedule(before, seed=0)
    _, k0, k1 = loops(sch, "sum")
    raises_unchanged(sch, lambda: sch.rfactor(k1, 0), "hides which partials")
    sch.rfactor(k0, 0)  # monotone in %k_1, and at %k_1 = 0 every partial passes the guard
    wb = next(b for b in _blocks(sch.func) if b.name == "sum")
    assert wb.predicate is None
    check(sch, before)


# ---------------------------------------------------------------------------------------------


def _blocks(f: PrimFunc) -> list[Block]:
    from hexir.ir.visit import walk

    return [n for n in walk(f.body) if isinstance(n, Block)]


def _loop(f: PrimFunc, name: str):  # noqa: ANN202
    from hexir.ir.tir import For
    from hexir.ir.visit import walk

    return next(n for n in walk(f.body) if isinstance(n, For) and n.var.name == name)
