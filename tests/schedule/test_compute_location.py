"""compute_at, reverse_compute_at, compute_inline, reverse_compute_inline (STYLE.md's idiom:
build the before IR, apply, compare with the expected IR, check trace round trips, replay,
verify and numerics)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from schedule_fixtures import check, func, raises_unchanged

import hexir
from hexir.graph.lower import lower
from hexir.ir.tir import PrimFunc
from hexir.ops.builder import GraphBuilder
from hexir.schedule import INLINE, ROOT, LoopRV, Schedule
from hexir.schedule.common import all_blocks, all_loops


def workload(name: str, **shape: object) -> PrimFunc:
    # The `source` attribute only repeats the graph; without it the expected texts stay short.
    return replace(hexir.workload(name, **shape), attrs=())


def dense_bias_relu(M: int = 8) -> PrimFunc:
    return workload("dense", M=M, N=16, K=32, bias=True, activation="relu")


def pad_conv() -> PrimFunc:
    b = GraphBuilder("padconv")
    x = b.input("X", (1, 2, 6, 6), "float32")
    w = b.input("W", (3, 2, 3, 3), "float32")
    y = b.conv2d(b.pad(x, (0, 0, 1, 1), (0, 0, 1, 1)), w, 1, 0, 1, 1)
    return replace(lower(b.build(y), "padconv", ["X", "W", "Y"]), attrs=())


# An elementwise chain: T1 = A * 2, T2 = exp(T1) + B, C = T2 - 1.
CHAIN = """\
hextir.func @chain(%A: buffer<6x5xf32>, %B: buffer<6x5xf32>, %C: buffer<6x5xf32>) {
  alloc %T1: buffer<6x5xf32>
  alloc %T2: buffer<6x5xf32>
  for %i in 0..6 serial {
    for %j in 0..5 serial {
      block @scale(vi = spatial(6) %i, vj = spatial(5) %j) reads(%A[vi, vj]) writes(%T1[vi, vj]) {
        %T1[vi, vj] = %A[vi, vj] * 2.0
      }
    }
  }
  for %i1 in 0..6 serial {
    for %j1 in 0..5 serial {
      block @exp_add(vi1 = spatial(6) %i1, vj1 = spatial(5) %j1) reads(%T1[vi1, vj1], %B[vi1, vj1]) writes(%T2[vi1, vj1]) {
        %T2[vi1, vj1] = exp(%T1[vi1, vj1]) + %B[vi1, vj1]
      }
    }
  }
  for %i2 in 0..6 serial {
    for %j2 in 0..5 serial {
      block @shift(vi2 = spatial(6) %i2, vj2 = spatial(5) %j2) reads(%T2[vi2, vj2]) writes(%C[vi2, vj2]) {
        %C[vi2, vj2] = %T2[vi2, vj2] - 1.0
      }
    }
  }
}"""  # noqa: E501


# ---------------------------------------------------------------------------------------------
# compute_inline

INLINED_BIAS_ADD = """\
hextir.func @dense(%X: buffer<8x32xf32>, %W: buffer<16x32xf32>, %bias: buffer<16xf32>, %Y: buffer<8x16xf32>) {
  alloc %dense: buffer<8x16xf32>
  for %i0 in 0..8 serial {
    for %i1 in 0..16 serial {
      for %k0 in 0..32 serial {
        block @dense(vi0 = spatial(8) %i0, vi1 = spatial(16) %i1, vk0 = reduce(32) %k0) reads(%X[vi0, vk0], %W[vi1, vk0]) writes(%dense[vi0, vi1]) {
          init {
            %dense[vi0, vi1] = 0.0
          }
          %dense[vi0, vi1] = %dense[vi0, vi1] + %X[vi0, vk0] * %W[vi1, vk0]
        }
      }
    }
  }
  for %i4 in 0..8 serial {
    for %i5 in 0..16 serial {
      block @relu(vi4 = spatial(8) %i4, vi5 = spatial(16) %i5) reads(%dense[vi4, vi5], %bias[vi5]) writes(%Y[vi4, vi5]) {
        %Y[vi4, vi5] = max(%dense[vi4, vi5] + %bias[vi5], 0.0)
      }
    }
  }
}"""  # noqa: E501


def test_compute_inline_bias_add_into_relu() -> None:
    before = dense_bias_relu()
    sch = Schedule(before, seed=0)
    sch.compute_inline(sch.get_block("bias_add"))
    assert sch.func == func(INLINED_BIAS_ADD)
    assert str(sch.trace).endswith("sch.compute_inline(block=b0)")
    check(sch, before)


def test_compute_inline_chain_and_pad() -> None:
    before = func(CHAIN)
    sch = Schedule(before, seed=0)
    sch.compute_inline(sch.get_block("scale"))
    sch.compute_inline(sch.get_block("exp_add"))
    assert [b.name for b in all_blocks(sch.func.body)] == ["shift"]
    assert "%C[vi2, vj2] = exp(%A[vi2, vj2] * 2.0) + %B[vi2, vj2] - 1.0" in str(sch.func)
    assert "alloc" not in str(sch.func)
    check(sch, before)
    before = pad_conv()
    sch = Schedule(before, seed=0)
    sch.compute_inline(sch.get_block("pad"))
    assert "select(" in str(sch.func) and "%pad" not in str(sch.func)
    check(sch, before)


def test_compute_inline_illegal() -> None:
    sch = Schedule(dense_bias_relu(), seed=0)
    dense, relu = sch.get_block("dense"), sch.get_block("relu")
    raises_unchanged(sch, lambda: sch.compute_inline(dense), "reduction")
    raises_unchanged(sch, lambda: sch.compute_inline(relu), "param %Y")
    two_stores = CHAIN.replace(
        "%T1[vi, vj] = %A[vi, vj] * 2.0", "%T1[vi, vj] = %A[vi, vj]\n%T1[vi, vj] = %A[vi, vj] * 2.0"
    )
    sch = Schedule(func(two_stores), seed=0)
    scale = sch.get_block("scale")
    raises_unchanged(sch, lambda: sch.compute_inline(scale), "single store")


# ---------------------------------------------------------------------------------------------
# reverse_compute_inline

FOLDED_RELU = """\
hextir.func @dense(%X: buffer<8x32xf32>, %W: buffer<16x32xf32>, %bias: buffer<16xf32>, %Y: buffer<8x16xf32>) {
  alloc %dense: buffer<8x16xf32>
  for %i0 in 0..8 serial {
    for %i1 in 0..16 serial {
      for %k0 in 0..32 serial {
        block @dense(vi0 = spatial(8) %i0, vi1 = spatial(16) %i1, vk0 = reduce(32) %k0) reads(%X[vi0, vk0], %W[vi1, vk0]) writes(%dense[vi0, vi1]) {
          init {
            %dense[vi0, vi1] = 0.0
          }
          %dense[vi0, vi1] = %dense[vi0, vi1] + %X[vi0, vk0] * %W[vi1, vk0]
        }
      }
    }
  }
  for %i2 in 0..8 serial {
    for %i3 in 0..16 serial {
      block @bias_add(vi2 = spatial(8) %i2, vi3 = spatial(16) %i3) reads(%dense[vi2, vi3], %bias[vi3]) writes(%Y[vi2, vi3]) {
        %Y[vi2, vi3] = max(%dense[vi2, vi3] + %bias[vi3], 0.0)
      }
    }
  }
}"""  # noqa: E501


def test_reverse_compute_inline_relu_into_bias_add() -> None:
    before = dense_bias_relu()
    sch = Schedule(before, seed=0)
    sch.reverse_compute_inline(sch.get_block("relu"))
    assert sch.func == func(FOLDED_RELU)
    check(sch, before)


def test_reverse_compute_inline_chain() -> None:
    before = func(CHAIN)
    sch = Schedule(before, seed=0)
    sch.reverse_compute_inline(sch.get_block("shift"))
    sch.reverse_compute_inline(sch.get_block("exp_add"))
    assert [b.name for b in all_blocks(sch.func.body)] == ["scale"]
    check(sch, before)


def test_reverse_compute_inline_illegal() -> None:
    sch = Schedule(dense_bias_relu(), seed=0)
    sch.compute_inline(sch.get_block("bias_add"))
    # relu's producer is now the dense reduction: its epilogue cannot fold into the update.
    relu = sch.get_block("relu")
    raises_unchanged(sch, lambda: sch.reverse_compute_inline(relu), "reduction")
    transposed = CHAIN.replace("%C[vi2, vj2] = %T2[vi2, vj2]", "%C[vi2, vj2] = %T2[vj2, vi2]")
    transposed = transposed.replace("6x5", "5x5").replace("(6)", "(5)").replace("0..6", "0..5")
    sch = Schedule(func(transposed), seed=0)
    shift = sch.get_block("shift")
    raises_unchanged(sch, lambda: sch.reverse_compute_inline(shift), "not an elementwise")
    sch = Schedule(workload("layer_norm", M=4, N=8), seed=0)
    norm = sch.get_block("layer_norm_norm")
    raises_unchanged(sch, lambda: sch.reverse_compute_inline(norm), "2 buffers")


# ---------------------------------------------------------------------------------------------
# compute_at

SOFTMAX_FUSED_ROWS = """\
hextir.func @softmax(%X: buffer<4x8xf32>, %Y: buffer<4x8xf32>) {
  alloc %softmax_max: buffer<4xf32>
  alloc %softmax_exp: buffer<4x8xf32>
  alloc %softmax_sum: buffer<4xf32>
  for %i0 in 0..4 serial {
    for %k0 in 0..8 serial {
      block @softmax_max(vi0 = spatial(4) %i0, vk0 = reduce(8) %k0) reads(%X[vi0, vk0]) writes(%softmax_max[vi0]) {
        init {
          %softmax_max[vi0] = -inf
        }
        %softmax_max[vi0] = max(%softmax_max[vi0], %X[vi0, vk0])
      }
    }
  }
  for %i3 in 0..4 serial {
    for %i2 in 0..8 serial {
      block @softmax_exp(vi1 = spatial(4) %i3, vi2 = spatial(8) %i2) reads(%X[vi1, vi2], %softmax_max[vi1]) writes(%softmax_exp[vi1, vi2]) {
        %softmax_exp[vi1, vi2] = exp(%X[vi1, vi2] - %softmax_max[vi1])
      }
    }
    for %k1 in 0..8 serial {
      block @softmax_sum(vi3 = spatial(4) %i3, vk1 = reduce(8) %k1) reads(%softmax_exp[vi3, vk1]) writes(%softmax_sum[vi3]) {
        init {
          %softmax_sum[vi3] = 0.0
        }
        %softmax_sum[vi3] = %softmax_sum[vi3] + %softmax_exp[vi3, vk1]
      }
    }
    for %i5 in 0..8 serial {
      block @softmax_norm(vi4 = spatial(4) %i3, vi5 = spatial(8) %i5) reads(%softmax_exp[vi4, vi5], %softmax_sum[vi4]) writes(%Y[vi4, vi5]) {
        %Y[vi4, vi5] = %softmax_exp[vi4, vi5] * (1.0 / %softmax_sum[vi4])
      }
    }
  }
}"""  # noqa: E501


def test_compute_at_softmax_rows() -> None:
    before = workload("softmax", M=4, N=8)
    sch = Schedule(before, seed=0)
    row, _ = sch.get_loops(sch.get_block("softmax_sum"))
    sch.reverse_compute_at(sch.get_block("softmax_norm"), row)
    sch.compute_at(sch.get_block("softmax_exp"), row)
    assert sch.func == func(SOFTMAX_FUSED_ROWS)
    assert "sch.compute_at(block=b4, loop=l1, preserve_unit_loops=False)" in str(sch.trace)
    check(sch, before)


def test_compute_at_preserve_unit_loops() -> None:
    before = workload("softmax", M=4, N=8)
    sch = Schedule(before, seed=0)
    row, _ = sch.get_loops(sch.get_block("softmax_sum"))
    sch.reverse_compute_at(sch.get_block("softmax_norm"), row, preserve_unit_loops=True)
    sch.compute_at(sch.get_block("softmax_exp"), row, preserve_unit_loops=True)
    text = str(sch.func)
    # The unit loops stay; their var, always 0, folds out of the bindings.
    assert "for %i1 in 0..1 serial" in text and "for %i4 in 0..1 serial" in text
    assert "vi1 = spatial(4) %i3" in text
    check(sch, before)


def test_compute_at_reduction_producer_into_tail_tile() -> None:
    # 10 rows in tiles of 4: the last tile runs past the domain, so dense gets a predicate.
    before = workload("dense", M=10, N=16, K=32, bias=False, activation="relu")
    sch = Schedule(before, seed=0)
    i, _ = sch.get_loops(sch.get_block("relu"))
    io, _ = sch.split(i, [None, 4])
    sch.compute_at(sch.get_block("dense"), io)
    text = str(sch.func)
    assert "block @dense(vi0 = spatial(10) %i2_0 * 4 + %i0, vi1 = spatial(16) %i1, " in text
    assert "where %i2_0 * 4 + %i0 < 10" in text and "for %k0 in 0..32 serial" in text
    check(sch, before)


def test_compute_at_pad_into_conv_rows() -> None:
    before = pad_conv()
    sch = Schedule(before, seed=0)
    loops = sch.get_loops(sch.get_block("conv2d"))
    sch.compute_at(sch.get_block("pad"), loops[2])
    # Per output row, the three padded input rows its 3x3 window reads.
    assert "vi2 = spatial(8) %i2 + %i6" in str(sch.func)
    assert "for %i2 in 0..3 serial" in str(sch.func)
    check(sch, before)


def test_compute_at_layer_norm() -> None:
    before = workload("layer_norm", M=4, N=8)
    sch = Schedule(before, seed=0)
    row, _ = sch.get_loops(sch.get_block("layer_norm_var"))
    sch.reverse_compute_at(sch.get_block("layer_norm_norm"), row)
    sch.compute_at(sch.get_block("layer_norm_mean"), row)
    # One row loop holding the two reductions and the normalization.
    assert [f.var.name for f in all_loops(sch.func.body)] == ["i1", "k0", "k1", "i3"]
    check(sch, before)


def test_compute_at_illegal() -> None:
    sch = Schedule(workload("softmax", M=4, N=8), seed=0)
    exp = sch.get_block("softmax_exp")
    row, _ = sch.get_loops(sch.get_block("softmax_sum"))
    # softmax_norm also reads softmax_exp and lies outside the row loop of softmax_sum.
    raises_unchanged(sch, lambda: sch.compute_at(exp, row), "not around @softmax_norm")
    own, _ = sch.get_loops(exp)
    raises_unchanged(sch, lambda: sch.compute_at(exp, own), "around @softmax_exp itself")
    norm_row, _ = sch.get_loops(sch.get_block("softmax_norm"))
    norm = sch.get_block("softmax_norm")
    raises_unchanged(sch, lambda: sch.compute_at(norm, row), "output %Y")
    raises_unchanged(sch, lambda: sch.compute_at(exp, norm_row), "not around @softmax_sum")


# ---------------------------------------------------------------------------------------------
# reverse_compute_at

TILED_DENSE_EPILOGUE = """\
hextir.func @dense(%X: buffer<8x32xf32>, %W: buffer<16x32xf32>, %bias: buffer<16xf32>, %Y: buffer<8x16xf32>) {
  alloc %dense: buffer<8x16xf32>
  alloc %bias_add: buffer<8x16xf32>
  for %i0_0 in 0..2 serial {
    for %i0_1 in 0..4 serial {
      for %i1 in 0..16 serial {
        for %k0 in 0..32 serial {
          block @dense(vi0 = spatial(8) %i0_0 * 4 + %i0_1, vi1 = spatial(16) %i1, vk0 = reduce(32) %k0) reads(%X[vi0, vk0], %W[vi1, vk0]) writes(%dense[vi0, vi1]) {
            init {
              %dense[vi0, vi1] = 0.0
            }
            %dense[vi0, vi1] = %dense[vi0, vi1] + %X[vi0, vk0] * %W[vi1, vk0]
          }
        }
      }
    }
    for %i2 in 0..4 serial {
      for %i3 in 0..16 serial {
        block @bias_add(vi2 = spatial(8) %i0_0 * 4 + %i2, vi3 = spatial(16) %i3) reads(%dense[vi2, vi3], %bias[vi3]) writes(%bias_add[vi2, vi3]) {
          %bias_add[vi2, vi3] = %dense[vi2, vi3] + %bias[vi3]
        }
      }
    }
    for %i4 in 0..4 serial {
      for %i5 in 0..16 serial {
        block @relu(vi4 = spatial(8) %i0_0 * 4 + %i4, vi5 = spatial(16) %i5) reads(%bias_add[vi4, vi5]) writes(%Y[vi4, vi5]) {
          %Y[vi4, vi5] = max(%bias_add[vi4, vi5], 0.0)
        }
      }
    }
  }
}"""  # noqa: E501


def test_reverse_compute_at_epilogue_under_dense_tile() -> None:
    before = dense_bias_relu()
    sch = Schedule(before, seed=0)
    i, _, _ = sch.get_loops(sch.get_block("dense"))
    io, _ = sch.split(i, [None, 4])
    sch.reverse_compute_at(sch.get_block("bias_add"), io)
    sch.reverse_compute_at(sch.get_block("relu"), io)
    assert sch.func == func(TILED_DENSE_EPILOGUE)
    check(sch, before)


def test_reverse_compute_at_tail_tile_after_inline() -> None:
    before = dense_bias_relu(M=10)
    sch = Schedule(before, seed=0)
    sch.compute_inline(sch.get_block("bias_add"))
    i, j, _ = sch.get_loops(sch.get_block("dense"))
    io, ii = sch.split(i, [None, 4])
    jo, _ = sch.split(j, [None, 8])
    sch.reorder(io, jo, ii)
    sch.reverse_compute_at(sch.get_block("relu"), jo)
    text = str(sch.func)
    assert "vi4 = spatial(10) %i0_0 * 4 + %i4, vi5 = spatial(16) %i1_0 * 8 + %i5" in text
    assert "where %i0_0 * 4 + %i4 < 10" in text
    check(sch, before)


# A local accumulator (what cache_write makes), written back after the whole loop nest.
LOCAL_ACC = """\
hextir.func @matmul(%A: buffer<12x16xf32>, %B: buffer<16x8xf32>, %C: buffer<12x8xf32>) {
  alloc %C_local: buffer<12x8xf32, local>
  for %i_0 in 0..3 serial {
    for %j_0 in 0..2 serial {
      for %i_1 in 0..4 serial {
        for %j_1 in 0..4 serial {
          for %k in 0..16 serial {
            block @matmul(vi = spatial(12) %i_0 * 4 + %i_1, vj = spatial(8) %j_0 * 4 + %j_1, vk = reduce(16) %k) reads(%A[vi, vk], %B[vk, vj]) writes(%C_local[vi, vj]) {
              init {
                %C_local[vi, vj] = 0.0
              }
              %C_local[vi, vj] = %C_local[vi, vj] + %A[vi, vk] * %B[vk, vj]
            }
          }
        }
      }
    }
  }
  for %i in 0..12 serial {
    for %j in 0..8 serial {
      block @C_local(vi2 = spatial(12) %i, vj2 = spatial(8) %j) reads(%C_local[vi2, vj2]) writes(%C[vi2, vj2]) {
        %C[vi2, vj2] = %C_local[vi2, vj2]
      }
    }
  }
}"""  # noqa: E501


def test_reverse_compute_at_write_back_under_tile() -> None:
    before = func(LOCAL_ACC)
    sch = Schedule(before, seed=0)
    _, jo, *_ = sch.get_loops(sch.get_block("matmul"))
    sch.reverse_compute_at(sch.get_block("C_local"), jo)
    text = str(sch.func)
    assert "block @C_local(vi2 = spatial(12) %i_0 * 4 + %i, vj2 = spatial(8) %j_0 * 4 + %j)" in text
    assert "for %i in 0..4 serial" in text and "for %j in 0..4 serial" in text
    check(sch, before)


def test_reverse_compute_at_illegal() -> None:
    sch = Schedule(dense_bias_relu(), seed=0)
    i, j, k = sch.get_loops(sch.get_block("dense"))
    bias_add = sch.get_block("bias_add")
    raises_unchanged(sch, lambda: sch.reverse_compute_at(bias_add, k), "partial results")
    relu = sch.get_block("relu")
    raises_unchanged(sch, lambda: sch.reverse_compute_at(relu, i), "runs after loop %i0")
    own, _ = sch.get_loops(bias_add)
    raises_unchanged(sch, lambda: sch.reverse_compute_at(bias_add, own), "itself")


# ---------------------------------------------------------------------------------------------
# Sampled locations


@pytest.mark.parametrize("decision", [0, 1, 4, 8])
def test_sampled_location_replays(decision: int) -> None:
    before = pad_conv()
    sch = Schedule(before, seed=0)
    pad = sch.get_block("pad")
    where = sch.sample_compute_location(pad, decision=decision)
    assert isinstance(where, LoopRV)
    sch.compute_at(pad, where)
    match sch.get(where):
        case loc if loc == ROOT:
            assert sch.func == before
        case loc if loc == INLINE:
            assert "%pad" not in str(sch.func)
        case _:
            assert "block @pad" in str(sch.func) and sch.func != before
    check(sch, before)
    # A changed decision flows through on replay.
    other = sch.trace.with_decision(1, (decision + 1) % 5)
    assert other.apply(before).func != sch.func
