"""CUDA C from GPU-scheduled hextir, without a GPU: every kernel compiles with NVRTC for sm_80
and sm_90, and the same schedules compute numpy's answer on the CPU path (GPU loops serial).

Golden sources: regenerate after a deliberate change with `python tests/codegen/test_cuda.py`
and read the diff before committing it.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.cuda import generate_cuda
from hexir.errors import ScheduleError
from hexir.runtime.nvrtc import compile_cuda
from hexir.runtime.target import Target
from hexir.schedule.handwritten import (
    MIN_BLOCKS,
    MIN_THREADS,
    VECTOR_TILING,
    Tiling,
    _fit,
    cpu_schedule,
    gpu_schedule,
)

GOLDEN = Path(__file__).parent / "golden"

# The seven workloads of DESIGN.md §9, small, with shapes that the tiles do not all divide.
WORKLOADS = {
    "matmul": dict(M=64, N=64, K=48),
    "batch_matmul": dict(B=2, M=32, N=32, K=16),
    "conv2d": dict(N=1, C=8, H=8, W=8, K=16, R=3, S=3, padding=1),
    "dense": dict(M=32, N=64, K=32, activation="relu"),
    "softmax": dict(M=4, N=200),
    "layer_norm": dict(M=4, N=96),
    "reduce_sum": dict(M=8, N=300),
}


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def _random(func: hexir.PrimFunc, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(b.shape).astype(np.float32) for b in func.inputs]


def _run_cpu(func: hexir.PrimFunc, scheduled: hexir.PrimFunc, rng: np.random.Generator) -> None:
    inputs = _random(func, rng)
    outputs = [np.full(b.shape, np.nan, np.float32) for b in func.outputs]
    hexir.build(scheduled, "cpu")(*inputs, *outputs)
    for got, want in zip(outputs, hexir.reference(func, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# batch_matmul and dense take matmul's schedule family: the quick loop compiles matmul's.
_SLOW = {"batch_matmul": pytest.mark.slow, "dense": pytest.mark.slow}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=_SLOW[n]) if n in _SLOW else n for n in WORKLOADS]
)
def test_gpu_schedule_compiles_for_sm80_and_sm90_and_computes_numpy_on_the_cpu(name, rng):
    func = hexir.workload(name, **WORKLOADS[name])
    sch = gpu_schedule(func)
    again = hexir.Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func
    kinds = {loop.kind for loop in _loops(sch.func)}
    assert {"blockIdx.x", "threadIdx.x"} <= kinds
    for arch in ("sm_80", "sm_90"):
        target = Target(f"cuda -arch={arch}")
        cuda = generate_cuda(sch.func, target)
        assert cuda.source.count("__global__") == 1  # one kernel, reductions included
        binary = compile_cuda(cuda.source, target, cuda.name)
        assert binary.resources["registers"] > 0
        assert binary.resources["shared_bytes"] >= cuda.static_shared_bytes
    _run_cpu(func, sch.func, rng)


def _loops(func: hexir.PrimFunc):
    from hexir.schedule.common import all_loops

    return list(all_loops(func.body))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_matmul_tile_has_no_spills_and_vector_fetches(arch):
    func = hexir.workload("matmul", M=2048, N=2048, K=64)
    sch = gpu_schedule(func)  # the default tiling: enough blocks at this size
    t = Tiling()
    target = Target(f"cuda -arch={arch}")
    cuda = generate_cuda(sch.func, target)
    assert cuda.block == (t.tx, t.ty, 1)
    assert cuda.grid == (2048 // (t.tx * t.nj), 2048 // (t.ty * t.mi), 1)
    assert "float4" in cuda.source and "__shared__" in cuda.source
    assert f"float C_local[{t.mi * t.nj}];" in cuda.source  # the accumulator: one thread's
    binary = compile_cuda(cuda.source, target, cuda.name)
    assert binary.resources["spill_bytes"] == 0
    assert binary.resources["stack_bytes"] == 0


@pytest.mark.parametrize(
    "name,shape,grid,block",
    [
        # the depth shared by 8 threads of each column (tests/runtime/test_default_schedule.py)
        ("matmul", dict(M=1, N=600, K=96), (75, 1, 1), (8, 8, 1)),
        # 300 columns in no block of 8 (W[n][k]): a thread per column, VECTOR_TILING
        ("dense", dict(M=1, N=300, K=130, bias=True), (-(-300 // VECTOR_TILING.tx), 1, 1),
         (VECTOR_TILING.tx, 1, 1)),
    ],
)  # fmt: skip
def test_a_one_row_contraction_spreads_its_columns_over_blocks_and_threads(
    name, shape, grid, block, rng
):
    """GPT-2's decode step multiplies one row by each weight: the columns go to blocks of
    threads (a row reduction's schedule would loop over every column in one block)."""
    func = hexir.workload(name, **shape)
    sch = gpu_schedule(func)
    cuda = generate_cuda(sch.func, Target("cuda -arch=sm_90"))
    assert (cuda.grid, cuda.block) == (grid, block)
    _run_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "name,shape",
    [
        ("matmul", dict(M=16, N=128, K=24)),
        ("matmul", dict(M=14, N=300, K=20)),  # ragged: guarded rows, columns and steps
        ("dense", dict(M=16, N=128, K=24, bias=True)),  # W[n][k]: columns every tx-th
        ("batch_matmul", dict(B=2, M=8, N=128, K=16)),
    ],
)
def test_a_thread_takes_its_columns_in_runs_of_four(name, shape, rng):
    """Eight columns a thread: two runs of four, tx * 4 apart, each one float4 read of B's
    tile (the write-back takes the same columns); numerics on the CPU path."""
    func = hexir.workload(name, **shape)
    sch = gpu_schedule(func, Tiling(ty=2, tx=8, mi=4, nj=8, bk=8))
    cuda = generate_cuda(sch.func, Target("cuda -arch=sm_90"))
    assert cuda.block == (8, 2, 1) and re.search(r"float \w+_local\[32\];", cuda.source)
    if name != "dense":
        assert re.search(r"B_shared\[.*_2 \* 4\)\) \+ 32\]", cuda.source)  # 8 threads x 4 on
    _run_cpu(func, sch.func, rng)


@pytest.mark.parametrize(
    "rows,cols,outer", [(128, 768, 1), (197, 3072, 1), (128, 64, 12), (256, 256, 1), (8, 8, 1)]
)
def test_small_contractions_split_into_enough_blocks(rows, cols, outer):
    """BERT's 128 x 768 matmul in the 128 x 128 tile of a large one would be 6 blocks on a
    132-multiprocessor GPU: the tile shrinks, outputs per thread first, until the grid has
    MIN_BLOCKS blocks or the block MIN_THREADS threads."""
    t = _fit(Tiling(), rows, cols, outer)
    blocks = outer * -(-rows // (t.ty * t.mi)) * -(-cols // (t.tx * t.nj))
    assert blocks >= MIN_BLOCKS or t.ty * t.tx <= MIN_THREADS
    assert t.bk == Tiling().bk and t.ty * t.mi <= max(rows, 16) and t.tx * t.nj <= max(cols, 16)
    assert _fit(Tiling(), 4096, 4096) == Tiling()  # 1024 blocks already: the large tile stays


def test_row_reductions_are_one_kernel_of_warp_shuffles():
    func = hexir.workload("softmax", M=4, N=200)
    cuda = generate_cuda(gpu_schedule(func).func, "cuda -arch=sm_90")
    src = cuda.source
    assert cuda.grid == (4, 1, 1) and cuda.block == (128, 1, 1)
    assert src.count("all-reduce") == 2 and "__shfl_xor_sync(0xffffffffu" in src
    assert "< 200" in src  # the predicate of the split that does not divide 200
    # Shuffles within each warp, then across the 4 warps through shared scratch.
    assert "__shared__ float red_scratch_f32[4];" in src


def test_rfactor_then_thread_binding_is_a_cross_thread_reduction():
    func = hexir.workload("reduce_sum", M=8, N=300)
    sch = gpu_schedule(func)
    assert "rfactor" in str(sch.trace)
    src = generate_cuda(sch.func, "cuda -arch=sm_90").source
    # The partials in shared memory, a barrier, then the all-reduce of the write-back.
    assert "__shared__ __align__(16) float Y_rf[128];" in src
    assert src.index("__syncthreads();") < src.index("all-reduce (+)")


def test_small_reduction_shuffles_within_a_partial_warp(rng):
    func = hexir.workload("reduce_sum", M=2, N=16)
    sch = hexir.Schedule(func, seed=0)
    rows, k = sch.get_loops(sch.get_block("reduce_sum"))
    sch.bind(rows, "blockIdx.x")
    sch.bind(k, "threadIdx.x")
    src = generate_cuda(sch.func, "cuda -arch=sm_90").source
    assert "__shfl_xor_sync" in src and "red_scratch" not in src
    assert "(1u << lanes) - 1u" in src  # 16 threads: a warp of 16 lanes
    compile_cuda(src, Target("cuda -arch=sm_90"), "reduce_sum")
    _run_cpu(func, sch.func, rng)


def test_vthread_is_unrolled_and_math_is_spelled_for_cuda(rng):
    func = hexir.workload("softmax", M=2, N=64)
    sch = gpu_schedule(func)
    plain = generate_cuda(sch.func, "cuda -arch=sm_90").source
    fast = generate_cuda(sch.func, "cuda -arch=sm_90", fast_math=True).source
    assert "expf(" in plain and "__expf(" not in plain and "__expf(" in fast
    ln = hexir.workload("layer_norm", M=2, N=64)
    assert "rsqrtf(" in generate_cuda(gpu_schedule(ln).func, "cuda -arch=sm_90").source

    add = hexir.workload("matmul", M=16, N=16, K=8)
    sch = hexir.Schedule(add, seed=0)
    i, j, k = sch.get_loops(sch.get_block("matmul"))
    i0, iv, i1 = sch.split(i, [None, 2, 4])
    sch.reorder(i0, j, iv, i1, k)
    sch.bind(i0, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sch.bind(iv, "vthread")
    src = generate_cuda(sch.func, "cuda -arch=sm_90").source
    assert "vthread" not in src
    assert src.count("// block matmul") == 2  # one copy per virtual thread, rows 64 apart
    assert "+ 64] = 0.0f;" in src
    _run_cpu(add, sch.func, rng)


def test_a_cross_thread_reduction_needs_threadIdx_x():
    func = hexir.workload("reduce_sum", M=4, N=32)
    sch = hexir.Schedule(func, seed=0)
    rows, k = sch.get_loops(sch.get_block("reduce_sum"))
    sch.bind(rows, "blockIdx.x")
    sch.bind(k, "threadIdx.y")
    with pytest.raises(ScheduleError, match="only threadIdx.x reduces across threads"):
        generate_cuda(sch.func, "cuda -arch=sm_90")


def test_a_local_buffer_two_threads_share_is_refused():
    func = hexir.workload("matmul", M=32, N=32, K=8)
    sch = hexir.Schedule(func, seed=0)
    mm = sch.get_block("matmul")
    c_local = sch.cache_write(mm, 0, "local")
    i, j, k = sch.get_loops(mm)
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    sch.reverse_compute_at(c_local, i)
    *_, col = sch.get_loops(c_local)
    sch.bind(col, "threadIdx.y")  # written by threadIdx.x = c, read back by threadIdx.y = c
    with pytest.raises(ScheduleError, match="local buffer %C_local"):
        generate_cuda(sch.func, "cuda -arch=sm_90")


def test_cpu_schedule_is_the_benchmark_schedule(rng):
    func = hexir.workload("matmul", M=32, N=128, K=16)
    sch = cpu_schedule(func, mr=4, nr=64)
    assert "sch.parallel" in str(sch.trace) and "sch.vectorize" in str(sch.trace)
    _run_cpu(func, sch.func, rng)


# ---------------------------------------------------------------------------------------------
# Golden sources


def _golden_cases() -> dict[str, hexir.PrimFunc]:
    """A tiled matmul (shared tiles, float4 fetches, a register tile, barriers) and a
    softmax (cross-thread reductions, a non-dividing split)."""
    tile = Tiling(ty=2, tx=4, mi=2, nj=2, bk=4)
    matmul = gpu_schedule(hexir.workload("matmul", M=8, N=16, K=8), tile).func
    softmax = gpu_schedule(hexir.workload("softmax", M=2, N=40)).func
    return {"cuda_matmul": matmul, "cuda_softmax": softmax}


@pytest.mark.parametrize("name", ["cuda_matmul", "cuda_softmax"])
def test_golden_source(name):
    source = generate_cuda(_golden_cases()[name], "cuda -arch=sm_90").source
    assert source == (GOLDEN / f"{name}.cu").read_text()


if __name__ == "__main__":
    for name, func in _golden_cases().items():
        (GOLDEN / f"{name}.cu").write_text(generate_cuda(func, "cuda -arch=sm_90").source)
        print(f"wrote {GOLDEN / name}.cu", file=sys.stderr)


@pytest.mark.parametrize("model", ["resnet18", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_every_resnet_conv_takes_the_tiled_schedule_within_shared_memory(model):
    """Each conv kernel of the model (bias, residual and relu fused) gets the hand-written
    tiled schedule, a few channels of a few padded rows per shared tile, within sm_90's 48 KB
    of static shared memory per block. (The default schedule does not take it for convs yet:
    it ran slower than the plain binding on an H200; see hexir/runtime/default_schedule.py.)"""
    from hexir.codegen.gpu_verify import verify_gpu
    from hexir.frontend import zoo
    from hexir.schedule.compact import compact_buffers
    from hexir.search.scheduler import extract_tasks

    target = Target("cuda -arch=sm_90")
    convs = [t.func for t in extract_tasks(zoo.zoo_model(model), target) if "conv2d" in t.name]
    assert len(convs) >= 10
    for func in convs:
        # verify_gpu raises ResourceError over the target's shared memory or thread limits
        launch = verify_gpu(compact_buffers(gpu_schedule(func).func), target)
        assert launch.threads >= 16 and math.prod(launch.grid) >= 64, func.name


def test_the_search_unroll_annotation_on_a_block_loop_unrolls_the_small_loops_inside():
    """The GPU sketch puts `pragma_auto_unroll_max_step` on the blockIdx loop; the printer
    honours it on the serial loops inside (it was dropped with the bound loop's annotations)."""
    from hexir.ir.tir import AUTO_UNROLL_KEY

    target = Target("cuda -arch=sm_90")
    sch = hexir.Schedule(hexir.workload("matmul", M=64, N=64, K=8))
    i, j, _ = sch.get_loops(sch.get_block("matmul"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    plain = generate_cuda(sch.func, target).source
    sch.annotate(i, AUTO_UNROLL_KEY, 16)  # k's 8 iterations fit
    assert "#pragma unroll" not in plain
    assert "#pragma unroll" in generate_cuda(sch.func, target).source
