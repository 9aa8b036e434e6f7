"""Default schedules: what kernels run with when the database has nothing for them."""

import numpy as np
import pytest

import hexir
from hexir.codegen.gpu_verify import verify_gpu
from hexir.frontend import zoo
from hexir.graph.fusion import partition
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.executor import simplify
from hexir.runtime.target import Target
from hexir.schedule.compact import compact_buffers


def check_on_cpu(func: hexir.PrimFunc, scheduled: hexir.PrimFunc, rng: np.random.Generator) -> None:
    """The scheduled func, run on the CPU, computes numpy's answer for the unscheduled one."""
    inputs = [rng.standard_normal(b.shape).astype(b.dtype) for b in func.inputs]
    outputs = [np.full(b.shape, np.nan, b.dtype) for b in func.outputs]
    hexir.build(scheduled, "cpu")(*inputs, *outputs)
    for out, ref in zip(outputs, hexir.reference(func, inputs), strict=True):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def _loops(func: hexir.PrimFunc):
    from hexir.schedule.common import all_loops

    return all_loops(func.body)


def test_cpu_matmul_gets_the_hand_schedule_shape_with_no_draw(rng):
    """Column panels and row tiles in parallel (enough jobs for the cores), B packed per
    job, a register tile of 8 rows by up to four vectors (rows unrolled, columns vectorized:
    8 x 48 with AVX-512's 16 lanes, 8 x 24 with AVX2's 8), the whole reduction inside; the
    same schedule every time."""
    func = hexir.workload("matmul", M=32, N=48, K=16)
    lanes = Target("cpu").vector_width
    cols = max(c for c in range(lanes, 4 * lanes + 1, lanes) if 48 % c == 0)
    sch = default_schedule(func, "cpu")
    assert str(sch.trace) == str(default_schedule(func, "cpu").trace)
    text = str(sch.trace)
    assert "decision=[4, 1, 1, 8]" in text and f"decision=[{48 // cols}, 1, 1, {cols}]" in text
    assert 'cache_read(block=b0, read_buffer_index=1, storage_scope="global")' in text
    assert "sample_categorical" not in text  # no unroll draw
    compact = compact_buffers(sch.func)
    assert f"buffer<8x{cols}xf32, local>" in str(compact)
    kinds = [lp.kind for lp in _loops(sch.func)]
    assert "parallel" in kinds and "vectorized" in kinds and "unrolled" in kinds
    check_on_cpu(func, sch.func, rng)


def test_cpu_padded_conv2d_vectorizes_output_channels_with_a_channels_last_weight(rng):
    # The padded input is read through min/max along rows and columns: the vector loop runs
    # over output channels, W packed channels-last per parallel job.
    func = hexir.workload("conv2d", N=1, C=4, H=8, W=8, K=16, R=3, S=3, padding=1)
    sch = default_schedule(func, "cpu")
    text = str(sch.func)
    assert "W_global[vk0, vk1, vk2, vi1]" in text and "Y_local[vi0, vi2, vi3, vi1]" in text
    kinds = [lp.kind for lp in _loops(sch.func)]
    assert "parallel" in kinds and "vectorized" in kinds
    check_on_cpu(func, sch.func, rng)


def test_cpu_defaults_of_elementwise_and_row_reductions_stay_simple():
    func = hexir.workload("softmax", M=16, N=40)
    text = str(default_schedule(func, "cpu").trace)
    assert "cache_read" not in text and "sch.parallel" in text


def test_a_replayed_default_trace_gives_the_same_kernel():
    func = hexir.workload("softmax", M=16, N=40)
    sch = default_schedule(func, "cpu")
    assert hexir.Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func


@pytest.mark.parametrize("name", ["bert", pytest.param("resnet", marks=pytest.mark.slow)])
def test_gpu_defaults_bind_threads_fit_the_gpu_and_compute_the_same_values(name, rng):
    graph = {
        "bert": lambda: zoo.bert(seq=8, hidden=32, heads=2, ffn=64),
        "resnet": lambda: zoo.resnet(18, image=16, width=4, classes=10),
    }[name]()
    target = hexir.Target("cuda -arch=sm_90")
    # In graph order (a set's order would change with the hash seed, and so the draws).
    funcs = dict.fromkeys(hexir.lower(group.graph()) for group in partition(simplify(graph)))
    for func in funcs:
        sch = default_schedule(func, target)
        launch = verify_gpu(compact_buffers(sch.func), target)
        assert launch.threads > 1, f"{func.name} runs on one thread"
        check_on_cpu(func, sch.func, rng)
