"""Tensor cores: sch.tensorize of a warp's m16n8k16 nest (hexir/schedule/tensorize.py), the
hand-written schedule that uses it (handwritten_mma.py), its CUDA C (ldmatrix and mma.sync,
cuda_mma.py) built by NVRTC for sm_80 and sm_90 without spills, the static analyzer's
tensor-core reading, and the same schedules run on the CPU, where the nests are loops: their
numbers against numpy on random inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.codegen.cuda import generate_cuda
from hexir.codegen.gpu_analyze import analyze
from hexir.errors import ScheduleError
from hexir.ir.dtype import numpy_dtype
from hexir.schedule import Schedule, Trace
from hexir.schedule.handwritten import gpu_schedule
from hexir.schedule.handwritten_mma import MmaTiling, mma_contraction, mma_schedule, mma_tiling

F16 = "cuda_mma_m16n8k16_f16"


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with knobs.scope(cache_dir=str(tmp_path_factory.mktemp("cache"))):
        yield


def run_on_cpu(func, sch, rng):
    kernel = hexir.build(sch.func, "cpu")
    inputs = [
        rng.standard_normal([int(d) for d in p.shape]).astype(numpy_dtype(p.dtype))
        for p in func.params[:-1]
    ]
    out = func.params[-1]
    got = np.zeros([int(d) for d in out.shape], numpy_dtype(out.dtype))
    kernel(*inputs, got)
    return inputs, got


# bfloat16 in the slow suite: the same nests as float16's, converted otherwise
@pytest.mark.slow  # 1.6-2.7 s each: the float16 loops on the CPU
@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "name, shape",
    [("matmul", dict(M=256, N=128, K=128)), ("batch_matmul", dict(B=2, M=128, N=128, K=64))],
)
def test_tensor_core_schedules_compute_the_product_on_the_cpu(rng, name, shape, dtype):
    func = hexir.workload(name, dtype=dtype, **shape)
    sch = mma_schedule(func, MmaTiling(bk=64))
    (a, b), got = run_on_cpu(func, sch, rng)
    want = a.astype(np.float64) @ b.astype(np.float64)
    # float16 rounds the float32 sum once more; bfloat16's product is float32
    tol = 2e-3 if got.dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 8)


def test_a_float16_dense_keeps_its_bias_in_the_write_back(rng):
    func = hexir.workload("dense", M=128, N=256, K=128, dtype="float16")
    sch = mma_schedule(func)
    (x, w, bias), got = run_on_cpu(func, sch, rng)
    product = (x.astype(np.float32) @ w.astype(np.float32).T).astype(np.float16)
    want = (product.astype(np.float32) + bias.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3)
    source = generate_cuda(sch.func, "cuda -arch=sm_90").source
    assert "hx_ldsm_b(" in source  # W[n][k]: ldmatrix without .trans


@pytest.mark.parametrize(
    "dtype, ptx", [("float16", "f16"), pytest.param("bfloat16", "bf16", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_4096_cube_builds_for_tensor_cores_without_spills(dtype, ptx, arch):
    func = hexir.workload("matmul", M=4096, N=4096, K=4096, dtype=dtype)
    sch = gpu_schedule(func)  # the default GPU schedule of a float16 contraction
    kernel = hexir.build(sch.func, f"cuda -arch={arch}")
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx}.{ptx}.f32" in kernel.source
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in kernel.source
    assert "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in kernel.source
    assert kernel.resources["spill_bytes"] == 0 and kernel.resources["stack_bytes"] == 0
    assert re.search(r"float C\w*_local\[128\];", kernel.source)  # 64 x 64 a warp: no holes
    # each A fragment loaded once per k step and reused for the 8 column tiles
    assert kernel.source.count("hx_ldsm_a(") == 1 + 4 and kernel.source.count("hx_mma_") == 33
    report = analyze(kernel)
    assert report.tensor_cores and report.conflict_free
    # per 16-deep step a warp: 32 mma (32 clocks on sm_90, 64 on sm_80) from 4 A fragments
    # (4 wavefronts each) and 8 B fragments (2 each)
    assert report.memory_clocks == 32
    assert report.fma_clocks == (32 if arch == "sm_90" else 64)
    assert report.predicted == 1.0 and "of tensor-core peak" in str(report)


def test_unpadded_tiles_show_ldmatrix_bank_conflicts():
    func = hexir.workload("matmul", M=1024, N=1024, K=1024, dtype="float16")
    report = analyze(hexir.build(mma_schedule(func, MmaTiling(pad=False)).func, "cuda -arch=sm_90"))
    loads = {a.buffer: a for a in report.accesses if a.kind == "load"}
    # A's rows 128 bytes apart: the 8 rows of a matrix in the same 4 banks
    assert loads["A_shared"].degree == 8 and not report.conflict_free
    assert report.predicted < 0.2


def test_the_trace_prints_serializes_and_replays_the_tensor_core_schedule():
    func = hexir.workload("matmul", M=256, N=256, K=64, dtype="float16")
    sch = mma_schedule(func)
    assert f'intrinsic="{F16}")' in str(sch.trace)
    again = Trace.from_json(sch.trace.to_json()).apply(func)
    assert again.func == sch.func


def test_only_divisible_float16_and_bfloat16_contractions_take_tensor_cores():
    assert mma_contraction(hexir.workload("matmul", M=256, N=256, K=64, dtype="bfloat16"))
    assert not mma_contraction(hexir.workload("matmul", M=256, N=256, K=64))  # float32
    assert not mma_contraction(hexir.workload("matmul", M=200, N=256, K=64, dtype="float16"))
    with pytest.raises(ValueError, match="no float16/bfloat16 contraction"):
        mma_schedule(hexir.workload("matmul", M=256, N=256, K=64))


def warp_nest(func, lane_rows_first=True, pair_inside=True):
    """A 128 x 128 x 16 warp tile of `func`'s matmul in four warps, the lane fused from its
    row (8) and column pair (4) in that order (the instruction's) or the other; a thread's
    two rows 8 apart (the instruction's) or 32."""
    sch = Schedule(func)
    mm = sch.get_block("matmul")
    sch.cache_write(mm, 0, "local")
    i, j, k = sch.get_loops(mm)
    if pair_inside:
        wy, mi, ri, q = sch.split(i, [None, 4, 2, 8])
    else:
        wy, ri, mi, q = sch.split(i, [None, 2, 4, 8])
    wx, nj, r, cj = sch.split(j, [None, 8, 4, 2])
    k0, kk = sch.split(k, [None, 16])
    lane = (q, r) if lane_rows_first else (r, q)
    sch.reorder(wy, wx, *lane, k0, mi, nj, ri, cj, kk)
    sch.bind(sch.fuse(wy, wx), "threadIdx.y")
    sch.bind(sch.fuse(*lane), "threadIdx.x")
    sch.decompose_reduction(mm, k0)
    return sch, (ri, cj)


def test_a_nest_that_is_not_a_warp_mma_is_refused_and_the_schedule_kept():
    func = hexir.workload("matmul", M=128, N=128, K=32, dtype="float16")
    sch, (ri, cj) = warp_nest(func)
    before, trace = sch.func, str(sch.trace)
    with pytest.raises(ScheduleError, match="not three loops of 2, 2 and 16"):
        sch.tensorize(cj, F16)
    with pytest.raises(ScheduleError, match="are float16 and float16, not bfloat16"):
        sch.tensorize(ri, "cuda_mma_m16n8k16_bf16")
    assert sch.func == before and str(sch.trace) == trace
    sch.tensorize(ri, F16)  # the right nest matches
    swapped, (ri, _) = warp_nest(func, lane_rows_first=False)  # lane % 8 is the row
    with pytest.raises(ScheduleError, match="index is not affine in the lane"):
        swapped.tensorize(ri, F16)
    apart, (ri, _) = warp_nest(func, pair_inside=False)
    with pytest.raises(ScheduleError, match=r"operands are not a\[lane/4 \+ 8\*ri, k\]"):
        apart.tensorize(ri, F16)
    plain = Schedule(func)
    i, j, k = plain.get_loops(plain.get_block("matmul"))
    i0, i1 = plain.split(i, [None, 2])
    with pytest.raises(ScheduleError, match="has None threads, not a warp's 32"):
        plain.tensorize(i1, F16)


def test_a_small_contraction_takes_smaller_tiles_to_fill_the_gpu(rng):
    """BERT's 128 x 3072 dense in 128 x 128 tiles would occupy 24 of 132 multiprocessors."""
    big = hexir.workload("dense", M=128, N=3072, K=768, dtype="float16")
    tiling = mma_tiling(big)
    assert tiling is not None and tiling.block == (32, 64)
    kernel = hexir.build(gpu_schedule(big).func, "cuda -arch=sm_90")
    assert kernel.grid == (48, 4, 1) and kernel.resources["spill_bytes"] == 0
    assert analyze(kernel).tensor_cores
    small = hexir.workload("matmul", M=32, N=64, K=32, dtype="float16")
    sch = mma_schedule(small)  # the smallest tiling: one block of 4 warps of 16 x 32
    (a, b), got = run_on_cpu(small, sch, rng)
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3)
    assert mma_tiling(hexir.workload("matmul", M=16, N=64, K=32, dtype="float16")) is None


def test_the_default_gpu_schedule_falls_back_where_the_tensor_core_one_fails(monkeypatch):
    from hexir.errors import ScheduleError
    from hexir.schedule import handwritten

    def refuse(func, tiling=None):
        raise ScheduleError("a stage it cannot fold", "mma_schedule")

    monkeypatch.setattr(handwritten, "mma_schedule", refuse)
    func = hexir.workload("matmul", M=128, N=128, K=64, dtype="float16")
    source = generate_cuda(handwritten.gpu_schedule(func).func, "cuda -arch=sm_90").source
    assert "mma.sync" not in source and "__shared__" in source  # the float tiling
