"""Barrier insertion: where a stage must wait for another, and nowhere else."""

from __future__ import annotations

import numpy as np

import hexir
from hexir.codegen.c_lower import lower_for_c
from hexir.codegen.cuda import generate_cuda
from hexir.codegen.cuda_sync import Pending, insert_syncs
from hexir.ir.tir import Barrier, Buffer, For, Seq

# Each half row of A goes through shared memory and comes out reversed: the second stage
# reads what other threads of the first wrote, and the next half overwrites what it read.
SHIFT = """
hextir.func @shift(%A: buffer<4x64xf32>, %B: buffer<4x64xf32>) {
  for %b in 0..4 blockIdx.x {
    alloc %S: buffer<32xf32, shared>
    for %h in 0..2 serial {
      for %t in 0..32 threadIdx.x {
        block @load(vb = spatial(4) %b, vh = spatial(2) %h, vt = spatial(32) %t)
            reads(%A[vb, vh * 32 + vt]) writes(%S[vt]) {
          %S[vt] = %A[vb, vh * 32 + vt]
        }
      }
      for %u in 0..32 threadIdx.x {
        block @store(vb = spatial(4) %b, vh = spatial(2) %h, vu = spatial(32) %u)
            reads(%S[31 - vu]) writes(%B[vb, vh * 32 + vu]) {
          %B[vb, vh * 32 + vu] = %S[31 - vu]
        }
      }
    }
  }
}
"""


def _serial_body(func: hexir.PrimFunc) -> tuple:
    body = insert_syncs(lower_for_c(func.body))
    (loop,) = [n for n in _walk(body) if isinstance(n, For) and n.kind == "serial"]
    assert isinstance(loop.body, Seq)
    return loop.body.stmts


def _walk(stmt):
    from hexir.ir.visit import walk

    return walk(stmt)


def test_barrier_before_a_read_of_shared_data_and_before_the_next_overwrite():
    stmts = _serial_body(hexir.parse(SHIFT))
    kinds = [type(s).__name__ if not isinstance(s, For) else s.kind for s in stmts]
    # The first barrier is for the next iteration: its load overwrites what the store read.
    assert kinds == ["Barrier", "threadIdx.x", "Barrier", "threadIdx.x"]
    src = generate_cuda(hexir.parse(SHIFT), "cuda -arch=sm_90").source
    assert src.count("__syncthreads();") == 2


def test_the_shifted_rows_on_the_cpu(rng):
    func = hexir.parse(SHIFT)
    a = rng.standard_normal((4, 64)).astype(np.float32)
    b = np.full_like(a, np.nan)
    hexir.build(func)(a, b)
    expect = np.concatenate([a[:, 31::-1], a[:, :31:-1]], axis=1)
    np.testing.assert_array_equal(b, expect)


def test_no_barrier_between_stages_that_share_nothing():
    text = SHIFT.replace("%S[31 - vu]", "%A[vb, vh * 32 + vu]")  # the store reads A itself
    body = insert_syncs(lower_for_c(hexir.parse(text).body))
    assert not any(isinstance(n, Barrier) for n in _walk(body))


def test_a_write_waits_for_reads_but_not_for_writes():
    s, t = Buffer("S", (4,), scope="shared"), Buffer("T", (4,), scope="shared")
    wrote_s = Pending(writes=frozenset({s}))
    read_s = Pending(reads=frozenset({s}))
    assert wrote_s.conflicts(read_s)  # read after write
    assert read_s.conflicts(wrote_s)  # write after read
    assert not wrote_s.conflicts(wrote_s)  # two stages writing their own elements
    assert not wrote_s.conflicts(Pending(reads=frozenset({t})))
    local = Buffer("L", (4,), scope="local")
    assert not Pending(writes=frozenset({local})).conflicts(Pending(reads=frozenset({s})))


def test_matmul_waits_once_per_tile_step():
    func = hexir.workload("matmul", M=64, N=64, K=32)
    from hexir.schedule.handwritten import gpu_schedule

    src = generate_cuda(gpu_schedule(func).func, "cuda -arch=sm_90").source
    loop = src[src.index("for (int k0_0") :]
    # Before the fetches (the previous step's readers) and before the compute stage.
    assert src.count("__syncthreads();") == 2 and loop.count("__syncthreads();") == 2
