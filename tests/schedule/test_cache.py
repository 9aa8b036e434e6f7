"""cache_read, cache_write, storage_align and compact_buffers (STYLE.md's primitive idiom)."""

from __future__ import annotations

import numpy as np
import pytest
from schedule_fixtures import MATMUL, TWO_STAGE, assert_same_numerics, check, func
from schedule_fixtures import raises_unchanged as _raises_unchanged

import hexir
from hexir.ir.tir import Allocate
from hexir.ir.verify import verify
from hexir.ir.visit import walk
from hexir.runtime.build import build
from hexir.schedule import Schedule, Trace
from hexir.schedule.compact import compact_buffers


def raises_unchanged(sch: Schedule, fn, match: str = "") -> None:  # noqa: ANN001
    err = _raises_unchanged(sch, fn, match)
    assert err.primitive in ("cache_read", "cache_write", "storage_align")


COPY_A = """\
  for %ax0 in 0..64 serial {
    for %ax1 in 0..32 serial {
      block @A_shared(v0 = spatial(64) %ax0, v1 = spatial(32) %ax1) reads(%A[v0, v1]) writes(%A_shared[v0, v1]) {
        %A_shared[v0, v1] = %A[v0, v1]
      }
    }
  }"""  # noqa: E501

MATMUL_A_SHARED = f"""\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {{
  alloc %A_shared: buffer<64x32xf32, shared>
{COPY_A}
  for %i in 0..64 serial {{
    for %j in 0..48 serial {{
      for %k in 0..32 serial {{
        block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k) reads(%A_shared[vi, vk], %B[vk, vj]) writes(%C[vi, vj]) {{
          init {{
            %C[vi, vj] = 0.0
          }}
          %C[vi, vj] = %C[vi, vj] + %A_shared[vi, vk] * %B[vk, vj]
        }}
      }}
    }}
  }}
}}"""  # noqa: E501

MATMUL_C_LOCAL = """\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  alloc %C_local: buffer<64x48xf32, local>
  for %i in 0..64 serial {
    for %j in 0..48 serial {
      for %k in 0..32 serial {
        block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k) reads(%A[vi, vk], %B[vk, vj]) writes(%C_local[vi, vj]) {
          init {
            %C_local[vi, vj] = 0.0
          }
          %C_local[vi, vj] = %C_local[vi, vj] + %A[vi, vk] * %B[vk, vj]
        }
      }
    }
  }
  for %ax0 in 0..64 serial {
    for %ax1 in 0..48 serial {
      block @C_local(v0 = spatial(64) %ax0, v1 = spatial(48) %ax1) reads(%C_local[v0, v1]) writes(%C[v0, v1]) {
        %C[v0, v1] = %C_local[v0, v1]
      }
    }
  }
}"""  # noqa: E501


# -- cache_read ---------------------------------------------------------------------------


def test_cache_read_matmul_shared_exact():
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    copy = sch.cache_read(sch.get_block("matmul"), 0, "shared")
    assert sch.func == func(MATMUL_A_SHARED)
    assert str(copy) == "A_shared"
    assert str(sch.trace).splitlines()[-1] == (
        'b1 = sch.cache_read(block=b0, read_buffer_index=0, storage_scope="shared")'
    )
    assert Trace.from_json(sch.trace.to_json()).apply(before).func == sch.func
    check(sch, before)


def test_cache_read_both_operands_global_and_shared():
    before = hexir.workload("matmul", M=24, N=20, K=12)
    sch = Schedule(before, seed=0)
    mm = sch.get_block("matmul")
    a = sch.cache_read(mm, 0, "global")
    b = sch.cache_read(mm, 1, "shared")
    assert (str(a), str(b)) == ("A_global", "B_shared")
    allocs = [s.buffer for s in sch.func.body.stmts[:2]]
    assert [(x.name, x.shape, x.scope) for x in allocs] == [
        ("A_global", (24, 12), "global"),
        ("B_shared", (12, 20), "shared"),
    ]
    # The copy is an ordinary block that compute_at can move: get_loops finds its loops.
    assert len(sch.get_loops(b)) == 2
    check(sch, before)


def test_cache_read_twice_gets_fresh_names():
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    mm = sch.get_block("matmul")
    sch.cache_read(mm, 0, "shared")
    second = sch.cache_read(mm, 0, "local")  # reads A_shared now: caches the cache
    assert str(second) == "A_shared_local"
    check(sch, before)


@pytest.mark.parametrize(
    "name,shape,block,index,scope",
    [
        ("batch_matmul", dict(B=2, M=8, N=6, K=5), "batch_matmul", 1, "shared"),
        ("conv2d", dict(N=1, C=3, H=6, W=6, K=4, R=3, S=3, padding=1), "conv2d", 0, "shared"),
        ("dense", dict(M=8, N=6, K=5, activation="relu"), "bias_add", 0, "local"),
        ("softmax", dict(M=6, N=10), "softmax_exp", 0, "global"),
    ],
)
def test_cache_read_workloads(name, shape, block, index, scope):
    before = hexir.workload(name, **shape)
    sch = Schedule(before, seed=0)
    b = sch.get_block(block)
    copy = sch.cache_read(b, index, scope)
    consumer = sch.get(b)
    assert any(r.buffer.scope == scope and r.buffer.name == str(copy) for r in consumer.reads)
    check(sch, before)


def test_cache_read_transposed_pack_of_dense_weight():
    """axes=(1, 0) packs dense's W[n, k] as W_global[k, n]: the consumer reads it along n,
    the pack moves under a tile loop and shrinks to the panel, and the numerics hold."""
    before = hexir.workload("dense", M=16, N=32, K=24)
    sch = Schedule(before, seed=0)
    dense = sch.get_block("dense")
    i, j, _ = sch.get_loops(dense)
    jo, _ = sch.split(j, [None, 8])
    sch.reorder(jo, i)
    pack = sch.cache_read(dense, 1, "global", axes=(1, 0))
    (w,) = [r for r in sch.get(dense).reads if r.buffer.name == str(pack)]
    assert w.buffer.shape == (24, 32)
    assert [str(e) for e in w.region] == ["%vk0", "%vi1"]
    sch.compute_at(pack, jo)
    check(sch, before)
    compact = compact_buffers(sch.func)
    shapes = {n.buffer.name: n.buffer.shape for n in walk(compact.body) if isinstance(n, Allocate)}
    assert shapes["W_global"] == (24, 8)
    assert_same_numerics(before, compact)
    assert "axes=(1, 0)" in str(sch.trace) or "axes=[1, 0]" in str(sch.trace)


def test_cache_read_rank3_permutation_numerics():
    before = hexir.workload("batch_matmul", B=2, M=8, N=6, K=5)
    sch = Schedule(before, seed=0)
    copy = sch.cache_read(sch.get_block("batch_matmul"), 1, "global", axes=(2, 0, 1))
    assert sch.get(copy).writes[0].buffer.shape == (6, 2, 5)
    check(sch, before)


def test_cache_read_illegal():
    sch = Schedule(func(MATMUL), seed=0)
    mm = sch.get_block("matmul")
    raises_unchanged(sch, lambda: sch.cache_read(mm, 0, "global", (0, 0)), "not a permutation")
    raises_unchanged(sch, lambda: sch.cache_read(mm, 0, "global", (1, 0, 2)), "not a permutation")
    raises_unchanged(sch, lambda: sch.cache_read(mm, 2, "shared"), "index 2 out of range")
    raises_unchanged(sch, lambda: sch.cache_read(mm, 0, "texture"), "unknown storage scope")
    two = Schedule(func(TWO_STAGE), seed=0)
    shift = two.get_block("shift")
    raises_unchanged(two, lambda: two.cache_read(shift, 0, "shared"), "written inside")


# -- cache_write --------------------------------------------------------------------------


def test_cache_write_matmul_local_exact():
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    wb = sch.cache_write(sch.get_block("matmul"), 0, "local")
    assert sch.func == func(MATMUL_C_LOCAL)
    assert str(wb) == "C_local"
    assert str(sch.trace).splitlines()[-1] == (
        'b1 = sch.cache_write(block=b0, write_buffer_index=0, storage_scope="local")'
    )
    check(sch, before)


@pytest.mark.parametrize(
    "name,shape,block,scope",
    [
        ("batch_matmul", dict(B=2, M=8, N=6, K=5), "batch_matmul", "local"),
        ("conv2d", dict(N=1, C=3, H=6, W=6, K=4, R=3, S=3, padding=1), "conv2d", "local"),
        ("dense", dict(M=8, N=6, K=5, activation="relu"), "dense", "local"),
        ("dense", dict(M=8, N=6, K=5, activation="relu"), "relu", "shared"),
        ("softmax", dict(M=6, N=10), "softmax_sum", "local"),
        ("softmax", dict(M=6, N=10), "softmax_norm", "global"),
    ],
)
def test_cache_write_workloads(name, shape, block, scope):
    before = hexir.workload(name, **shape)
    sch = Schedule(before, seed=0)
    b = sch.get_block(block)
    wb = sch.cache_write(b, 0, scope)
    assert sch.get(b).writes[0].buffer.name == str(wb)
    check(sch, before)


def test_cache_write_channels_last_accumulator():
    """axes=(0, 2, 3, 1) keeps conv2d's accumulator channels-last; the write-back walks it in
    that order and stores to Y's own layout; tiled and compacted, the numerics hold."""
    before = hexir.workload("conv2d", N=1, C=4, H=6, W=6, K=8, R=3, S=3, padding=1)
    sch = Schedule(before, seed=0)
    conv = sch.get_block("conv2d")
    wb = sch.cache_write(conv, 0, "local", axes=(0, 2, 3, 1))
    (local,) = sch.get(conv).writes
    assert local.buffer.shape == (1, 6, 6, 8)
    n, k, h, w = (str(iv.var) for iv in sch.get(conv).iter_vars[:4])
    assert [str(e) for e in local.region] == [n, h, w, k]
    (store,) = sch.get(wb).writes
    assert [str(e) for e in store.region] == ["%v0", "%v3", "%v1", "%v2"]
    check(sch, before)
    _, co, h, _, *_ = sch.get_loops(conv)
    sch.reverse_compute_at(wb, h)
    compact = compact_buffers(sch.func)
    shapes = {n.buffer.name: n.buffer.shape for n in walk(compact.body) if isinstance(n, Allocate)}
    assert shapes["Y_local"] == (1, 1, 6, 1)
    assert_same_numerics(before, compact)
    bad = Schedule(before, seed=0)
    block = bad.get_block("conv2d")
    raises_unchanged(bad, lambda: bad.cache_write(block, 0, "local", (0, 1)), "permutation")


def test_cache_read_write_after_split():
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    mm = sch.get_block("matmul")
    i, j, k = sch.get_loops(mm)
    io, ii = sch.split(i, [None, 10])  # 64 = 7 * 10 - 6: a predicated tail
    ko, ki = sch.split(k, [4, 8])
    sch.cache_read(mm, 1, "shared")
    wb = sch.cache_write(mm, 0, "local")
    assert [str(loop) for loop in sch.get_loops(mm)] == ["i_0", "i_1", "j", "k_0", "k_1"]
    assert len(sch.get_loops(wb)) == 2
    check(sch, before)


PARTIAL = """\
hextir.func @pad(%A: buffer<8xf32>, %C: buffer<10xf32>) {
  for %i in 0..10 serial {
    block @zero(vi = spatial(10) %i) reads() writes(%C[vi]) {
      %C[vi] = 0.0
    }
  }
  for %j in 0..8 serial {
    block @inner(vj = spatial(8) %j) reads(%A[vj]) writes(%C[vj + 1]) {
      %C[vj + 1] = %A[vj]
    }
  }
}"""


SHIFTED = """\
hextir.func @shift(%A: buffer<8xf32>, %C: buffer<9xf32>) {
  for %j in 0..8 serial {
    block @inner(vj = spatial(8) %j) reads(%A[vj]) writes(%C[vj + 1]) {
      %C[vj + 1] = %A[vj]
    }
  }
}"""


def test_cache_write_illegal():
    sch = Schedule(func(PARTIAL), seed=0)
    inner, zero = sch.get_block("inner"), sch.get_block("zero")
    raises_unchanged(sch, lambda: sch.cache_write(inner, 0, "local"), "also written by @zero")
    raises_unchanged(sch, lambda: sch.cache_write(zero, 1, "local"), "index 1 out of range")
    raises_unchanged(sch, lambda: sch.cache_write(zero, 0, "smem"), "unknown storage scope")
    shifted = Schedule(func(SHIFTED), seed=0)
    inner = shifted.get_block("inner")
    raises_unchanged(shifted, lambda: shifted.cache_write(inner, 0, "local"), "each element")
    text = SHIFTED.replace("vj + 1", "vj").replace("<9x", "<8x")
    in_place = Schedule(func(text.replace("= %A[vj]", "= %C[vj] + %A[vj]")), seed=0)
    inner = in_place.get_block("inner")
    raises_unchanged(in_place, lambda: in_place.cache_write(inner, 0, "local"), "no init")
    two = Schedule(func(TWO_STAGE), seed=0)
    scale = two.get_block("scale")
    raises_unchanged(two, lambda: two.cache_write(scale, 0, "local"), "@shift reads %T")


# -- storage_align ------------------------------------------------------------------------


def test_storage_align_exact():
    before = func(MATMUL)
    sch = Schedule(before, seed=0)
    copy = sch.cache_read(sch.get_block("matmul"), 0, "shared")
    sch.storage_align(copy, 0, 0, 32, 1)
    aligned = (
        MATMUL_A_SHARED.replace("buffer<64x32xf32, shared>", "buffer<64x33xf32, shared>")
        .replace("%A_shared: buffer<64x32", "%A_shared: buffer<64x33")
        .replace(
            "writes(%A_shared[v0, v1]) {",
            "writes(%A_shared[v0, v1]) attributes {storage_align = (0, 0, 32, 1)} {",
        )
    )
    assert sch.func == func(aligned)
    assert str(sch.trace).splitlines()[-1] == (
        "sch.storage_align(block=b1, buffer_index=0, axis=0, factor=32, offset=1)"
    )
    check(sch, before)


def test_storage_align_rank3_repeated_and_inner_axis():
    before = hexir.workload("batch_matmul", B=2, M=8, N=6, K=5)
    sch = Schedule(before, seed=0)
    copy = sch.cache_read(sch.get_block("batch_matmul"), 0, "shared")  # A_shared: 2x8x5

    def shape() -> tuple[int, ...]:
        return sch.get(copy).writes[0].buffer.shape

    sch.storage_align(copy, 0, 0, 16, 4)  # stride 8 * 5 = 40 -> 20 * 5 = 100 = 6 * 16 + 4
    assert shape() == (2, 20, 5)
    sch.storage_align(copy, 0, 0, 8, 0)  # the same axis again: replaces the request
    assert shape() == (2, 24, 5)
    sch.storage_align(copy, 0, 1, 4, 0)  # stride of axis 1: 5 -> 8
    assert shape() == (2, 24, 8)
    assert dict(sch.get(copy).annotations)["storage_align"] == (0, 0, 8, 0, 0, 1, 4, 0)
    check(sch, before)


def test_storage_align_illegal():
    sch = Schedule(func(MATMUL), seed=0)
    mm = sch.get_block("matmul")
    raises_unchanged(sch, lambda: sch.storage_align(mm, 0, 0, 32, 1), "is a parameter")
    copy = sch.cache_read(mm, 0, "shared")
    raises_unchanged(sch, lambda: sch.storage_align(copy, 0, 1, 32, 1), "no outer stride")
    raises_unchanged(sch, lambda: sch.storage_align(copy, 0, 0, 32, 32), "0 <= offset < factor")
    raises_unchanged(sch, lambda: sch.storage_align(copy, 3, 0, 32, 1), "out of range")


# -- compact_buffers ----------------------------------------------------------------------

# What cache_read + cache_write + compute_at/reverse_compute_at under (%i_0, %j_0) give.
TILED = """\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  alloc %A_shared: buffer<64x32xf32, shared>
  alloc %C_local: buffer<64x48xf32, local>
  for %i_0 in 0..8 serial {
    for %j_0 in 0..6 serial {
      for %ax0 in 0..8 serial {
        for %ax1 in 0..32 serial {
          block @A_shared(v0 = spatial(64) %i_0 * 8 + %ax0, v1 = spatial(32) %ax1) reads(%A[v0, v1]) writes(%A_shared[v0, v1]) {
            %A_shared[v0, v1] = %A[v0, v1]
          }
        }
      }
      for %i_1 in 0..8 serial {
        for %j_1 in 0..8 serial {
          for %k in 0..32 serial {
            block @matmul(vi = spatial(64) %i_0 * 8 + %i_1, vj = spatial(48) %j_0 * 8 + %j_1, vk = reduce(32) %k) reads(%A_shared[vi, vk], %B[vk, vj]) writes(%C_local[vi, vj]) {
              init {
                %C_local[vi, vj] = 0.0
              }
              %C_local[vi, vj] = %C_local[vi, vj] + %A_shared[vi, vk] * %B[vk, vj]
            }
          }
        }
      }
      for %ax0_1 in 0..8 serial {
        for %ax1_1 in 0..8 serial {
          block @C_local(v0_1 = spatial(64) %i_0 * 8 + %ax0_1, v1_1 = spatial(48) %j_0 * 8 + %ax1_1) reads(%C_local[v0_1, v1_1]) writes(%C[v0_1, v1_1]) {
            %C[v0_1, v1_1] = %C_local[v0_1, v1_1]
          }
        }
      }
    }
  }
}"""  # noqa: E501

TILED_COMPACT = """\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  for %i_0 in 0..8 serial {
    for %j_0 in 0..6 serial {
      alloc %A_shared: buffer<8x33xf32, shared>
      alloc %C_local: buffer<8x8xf32, local>
      for %ax0 in 0..8 serial {
        for %ax1 in 0..32 serial {
          block @A_shared(v0 = spatial(64) %i_0 * 8 + %ax0, v1 = spatial(32) %ax1) reads(%A[v0, v1]) writes(%A_shared[floormod(v0, 8), v1]) attributes {storage_align = (0, 0, 32, 1)} {
            %A_shared[floormod(v0, 8), v1] = %A[v0, v1]
          }
        }
      }
      for %i_1 in 0..8 serial {
        for %j_1 in 0..8 serial {
          for %k in 0..32 serial {
            block @matmul(vi = spatial(64) %i_0 * 8 + %i_1, vj = spatial(48) %j_0 * 8 + %j_1, vk = reduce(32) %k) reads(%A_shared[floormod(vi, 8), vk], %B[vk, vj]) writes(%C_local[floormod(vi, 8), floormod(vj, 8)]) {
              init {
                %C_local[floormod(vi, 8), floormod(vj, 8)] = 0.0
              }
              %C_local[floormod(vi, 8), floormod(vj, 8)] = %C_local[floormod(vi, 8), floormod(vj, 8)] + %A_shared[floormod(vi, 8), vk] * %B[vk, vj]
            }
          }
        }
      }
      for %ax0_1 in 0..8 serial {
        for %ax1_1 in 0..8 serial {
          block @C_local(v0_1 = spatial(64) %i_0 * 8 + %ax0_1, v1_1 = spatial(48) %j_0 * 8 + %ax1_1) reads(%C_local[floormod(v0_1, 8), floormod(v1_1, 8)]) writes(%C[v0_1, v1_1]) {
            %C[v0_1, v1_1] = %C_local[floormod(v0_1, 8), floormod(v1_1, 8)]
          }
        }
      }
    }
  }
}"""  # noqa: E501


def test_compact_buffers_tiles_and_realigns():
    before = func(TILED)
    sch = Schedule(before, seed=0)
    sch.storage_align(sch.get_block("A_shared"), 0, 0, 32, 1)
    compact = compact_buffers(sch.func)
    assert compact == func(TILED_COMPACT)
    verify(compact)
    assert_same_numerics(before, compact)
    assert compact_buffers(compact) == compact


def test_compact_buffers_keeps_what_it_cannot_shrink():
    sch = Schedule(func(MATMUL), seed=0)
    sch.cache_read(sch.get_block("matmul"), 0, "shared")
    sch.cache_write(sch.get_block("matmul"), 0, "local")
    # Both caches are used at the top level in full: nothing moves or shrinks.
    assert compact_buffers(sch.func) == sch.func
    dense = hexir.workload("dense", M=8, N=6, K=5, activation="relu")
    assert compact_buffers(dense) == dense


# The write-back sits under %k_0 (it runs after every partial sum, harmlessly): %k_0 feeds
# the reduction, so a fresh accumulator per %k_0 iteration would lose the sum.
CARRIED = """\
hextir.func @matmul(%A: buffer<16x8xf32>, %B: buffer<8x16xf32>, %C: buffer<16x16xf32>) {
  alloc %C_local: buffer<16x16xf32, local>
  for %k_0 in 0..2 serial {
    for %i in 0..16 serial {
      for %j in 0..16 serial {
        for %k_1 in 0..4 serial {
          block @matmul(vi = spatial(16) %i, vj = spatial(16) %j, vk = reduce(8) %k_0 * 4 + %k_1) reads(%A[vi, vk], %B[vk, vj]) writes(%C_local[vi, vj]) {
            init {
              %C_local[vi, vj] = 0.0
            }
            %C_local[vi, vj] = %C_local[vi, vj] + %A[vi, vk] * %B[vk, vj]
          }
        }
      }
    }
    for %ax0 in 0..16 serial {
      for %ax1 in 0..16 serial {
        block @C_local(v0 = spatial(16) %ax0, v1 = spatial(16) %ax1) reads(%C_local[v0, v1]) writes(%C[v0, v1]) {
          %C[v0, v1] = %C_local[v0, v1]
        }
      }
    }
  }
}"""  # noqa: E501


def test_compact_buffers_keeps_a_reduction_carried_accumulator(rng):
    before = func(CARRIED)
    verify(before)
    assert compact_buffers(before) == before
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 16)))
    c = np.full((16, 16), np.nan, np.float32)
    build(before)(a, b, c)
    assert np.allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_cache_then_compute_at_then_compact():
    """The whole story: cache, compute_at / reverse_compute_at to the tile, then compaction."""
    before = hexir.workload("matmul", M=64, N=48, K=32)
    sch = Schedule(before, seed=0)
    mm = sch.get_block("matmul")
    i, j, _ = sch.get_loops(mm)
    io, ii = sch.split(i, [None, 8])
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(io, jo, ii, ji)
    a = sch.cache_read(mm, 0, "shared")
    wb = sch.cache_write(mm, 0, "local")
    sch.compute_at(a, jo)
    sch.reverse_compute_at(wb, jo)
    compact = compact_buffers(sch.func)
    verify(compact)
    shapes = {
        b.name: b.shape for b in (n.buffer for n in walk(compact.body) if isinstance(n, Allocate))
    }
    assert shapes == {"A_shared": (8, 32), "C_local": (8, 8)}
    assert_same_numerics(before, compact)


def test_a_guarded_copy_compacts_to_the_rows_it_writes():
    """A cooperative fetch of a 2 x 16 tile split over more threads than it has elements
    (64 x 8 for 32 elements) is guarded by its split: `f1 * 8 + f2 < 32` holds f1 below 4, so
    the copy writes 2 rows per step, and the shared tile is 2 x 16, not the 8 x 16 its
    unguarded loops would span (a ring of 4 steps)."""
    before = hexir.workload("matmul", M=16, N=16, K=16)
    sch = Schedule(before, seed=0)
    mm = sch.get_block("matmul")
    i, j, k = sch.get_loops(mm)
    k0, k1 = sch.split(k, [None, 2])
    sch.reorder(k0, i, j, k1)
    b = sch.cache_read(mm, 1, "shared")
    sch.compute_at(b, k0)
    *_, rows, cols = sch.get_loops(b)
    sch.split(sch.fuse(rows, cols), [None, 64, 8])
    compact = compact_buffers(sch.func)
    verify(compact)
    shapes = {n.buffer.name: n.buffer.shape for n in walk(compact.body) if isinstance(n, Allocate)}
    assert shapes == {"B_shared": (2, 16)}
    assert_same_numerics(before, compact)
