"""The GPU verifier: launch shapes, and schedules over a target's limits or inconsistent."""

from __future__ import annotations

import pytest

import hexir
from hexir.codegen.cuda import generate_cuda
from hexir.codegen.gpu_verify import launch_shape, verify_gpu
from hexir.errors import ResourceError, ScheduleError
from hexir.runtime.target import Target
from hexir.schedule.handwritten import Tiling, gpu_schedule

SM90 = Target("cuda -arch=sm_90")


def test_launch_shape_of_a_tiled_matmul():
    func = gpu_schedule(hexir.workload("matmul", M=2048, N=4096, K=64)).func
    launch = verify_gpu(func, SM90)
    t = Tiling()
    assert launch.grid == (4096 // (t.tx * t.nj), 2048 // (t.ty * t.mi), 1)
    assert launch.block == (t.tx, t.ty, 1)
    assert launch.threads == t.tx * t.ty and launch.loop_of("blockIdx.x") == "i1_0"


def test_too_many_threads_per_block():
    sch = hexir.Schedule(hexir.workload("matmul", M=64, N=64, K=8), seed=0)
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "threadIdx.y")
    sch.bind(j, "threadIdx.x")
    with pytest.raises(ResourceError, match="4096 threads per block.*limit of 1024") as e:
        verify_gpu(sch.func, SM90)
    assert "threadIdx.x=64 (loop %i1)" in str(e.value)


def test_too_much_shared_memory():
    sch = hexir.Schedule(hexir.workload("matmul", M=128, N=128, K=128), seed=0)
    mm = sch.get_block("matmul")
    sch.cache_read(mm, 0, "shared")  # all of A: 64 KiB
    _, j, _ = sch.get_loops(mm)
    sch.bind(j, "threadIdx.x")
    with pytest.raises(ResourceError, match=r"65536 bytes of static shared memory") as e:
        generate_cuda(sch.func, SM90)
    assert "%A_shared 65536 B" in str(e.value) and "limit of 49152" in str(e.value)


def test_a_grid_over_the_y_limit():
    sch = hexir.Schedule(hexir.workload("matmul", M=70000, N=2, K=2), seed=0)
    i, _, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "blockIdx.y")
    with pytest.raises(ResourceError, match="extent 70000, over the CUDA grid dimension limit"):
        verify_gpu(sch.func, SM90)


def test_thread_extents_must_agree_across_stages():
    sch = hexir.Schedule(hexir.workload("softmax", M=4, N=128), seed=0)
    norm = sch.get_block("softmax_norm")
    rows, cols = sch.get_loops(norm)
    sch.compute_inline(sch.get_block("softmax_exp"))
    sch.bind(rows, "blockIdx.x")
    for name, threads in (("softmax_sum", 64), ("softmax_max", 64)):
        block = sch.get_block(name)
        sch.compute_at(block, rows)
        k0, k1 = sch.split(sch.get_loops(block)[-1], [None, threads])
        sch.reorder(k1, k0)
        sch.bind(k1, "threadIdx.x")
    c0, c1 = sch.split(cols, [None, 128])
    sch.bind(c1, "threadIdx.x")
    with pytest.raises(ScheduleError, match="bound to threadIdx.x with extent 128") as e:
        launch_shape(sch.func)
    assert "must have the same extent" in str(e.value)
    assert "for %i5_1 in 0..128 threadIdx.x {  <-- here" in e.value.ir


STAGES = """
hextir.func @stages(%A: buffer<64xf32>, %Y: buffer<64xf32>, %Z: buffer<64xf32>) {
  for %b in 0..2 blockIdx.x {
    for %t in 0..32 threadIdx.x {
      block @first(v = spatial(64) %b * 32 + %t) reads(%A[v]) writes(%Y[v]) {
        %Y[v] = %A[v] + 1.0
      }
    }
  }
  for %c in 0..2 blockIdx.x {
    for %u in 0..32 threadIdx.x {
      block @second(v = spatial(64) %c * 32 + %u) reads(%Y[63 - v]) writes(%Z[v]) {
        %Z[v] = %Y[63 - v]
      }
    }
  }
}
"""


def test_blocks_cannot_pass_data_to_each_other():
    with pytest.raises(ScheduleError, match="blocks do not wait for each other"):
        verify_gpu(hexir.parse(STAGES), SM90)


def test_work_outside_the_block_loops():
    text = STAGES.replace("for %c in 0..2 blockIdx.x", "for %c in 0..2 serial")
    with pytest.raises(ScheduleError, match="block @second runs outside every blockIdx loop"):
        verify_gpu(hexir.parse(text), SM90)


def test_intermediates_must_live_under_the_block_loops():
    sch = hexir.Schedule(hexir.workload("softmax", M=4, N=64), seed=0)
    for name in ("softmax_max", "softmax_exp", "softmax_sum", "softmax_norm"):
        rows, _ = sch.get_loops(sch.get_block(name))
        sch.bind(rows, "blockIdx.x")
    with pytest.raises(ScheduleError, match="%softmax_max is allocated outside every blockIdx"):
        verify_gpu(sch.func, SM90)


def test_a_stage_on_fewer_thread_axes_runs_on_thread_zero():
    text = STAGES.replace("%c in 0..2 blockIdx.x", "%c in 0..1 serial").replace(
        "for %b in 0..2 blockIdx.x", "for %b in 0..1 serial"
    )
    text = text.replace("for %u in 0..32 threadIdx.x", "for %u in 0..32 serial")
    text = text.replace("%b * 32 + %t", "%t").replace("%c * 32 + %u", "%u")
    text = text.replace("buffer<64xf32>", "buffer<32xf32>").replace("63 - v", "31 - v")
    launch = verify_gpu(hexir.parse(text), SM90)
    assert launch.grid == (1, 1, 1) and launch.block == (32, 1, 1)
    src = generate_cuda(hexir.parse(text), SM90).source
    assert "if (threadIdx.x == 0) {" in src
    assert src.index("__syncthreads();") < src.index("if (threadIdx.x == 0) {")
