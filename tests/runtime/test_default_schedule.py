"""Default schedules: what kernels run with when the database has nothing for them."""

import numpy as np
import pytest

import hexir
from hexir.codegen.gpu_verify import verify_gpu
from hexir.frontend import zoo
from hexir.graph.fusion import partition
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.executor import simplify
from hexir.schedule.compact import compact_buffers


def check_on_cpu(func: hexir.PrimFunc, scheduled: hexir.PrimFunc) -> None:
    """The scheduled func, run on the CPU, computes numpy's answer for the unscheduled one."""
    rng = np.random.default_rng()
    inputs = [rng.standard_normal(b.shape).astype(b.dtype) for b in func.inputs]
    outputs = [np.full(b.shape, np.nan, b.dtype) for b in func.outputs]
    hexir.build(scheduled, "cpu")(*inputs, *outputs)
    for out, ref in zip(outputs, hexir.reference(func, inputs)):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_cpu_matmul_gets_its_columns_vectorized_and_its_rows_parallel():
    func = hexir.workload("matmul", M=32, N=48, K=16)
    sch = default_schedule(func, "cpu")
    assert str(sch.trace).splitlines()[2:] == [
        "sch.reorder(l1, l3, l2)",
        "sch.vectorize(loop=l2)",
        "sch.parallel(loop=l1)",
    ]
    check_on_cpu(func, sch.func)


def test_cpu_padded_conv2d_keeps_its_order_and_runs_parallel():
    # The padded input is read through min/max: not unit-stride, so no vectorize.
    func = hexir.workload("conv2d", N=1, C=4, H=8, W=8, K=8, R=3, S=3, padding=1)
    sch = default_schedule(func, "cpu")
    text = str(sch.trace)
    assert "vectorize" not in text and "reorder" not in text
    assert "sch.fuse(l1, l2, l3, l4)" in text and "sch.parallel" in text
    check_on_cpu(func, sch.func)


def test_a_replayed_default_trace_gives_the_same_kernel():
    func = hexir.workload("softmax", M=16, N=40)
    sch = default_schedule(func, "cpu")
    assert hexir.Trace.from_json(sch.trace.to_json()).apply(func).func == sch.func


@pytest.mark.parametrize("name", ["bert", pytest.param("resnet", marks=pytest.mark.slow)])
def test_gpu_defaults_bind_threads_fit_the_gpu_and_compute_the_same_values(name):
    graph = {
        "bert": lambda: zoo.bert(seq=8, hidden=32, heads=2, ffn=64),
        "resnet": lambda: zoo.resnet(18, image=16, width=4, classes=10),
    }[name]()
    target = hexir.Target("cuda -arch=sm_90")
    funcs = {hexir.lower(group.graph()) for group in partition(simplify(graph))}
    for func in funcs:
        sch = default_schedule(func, target)
        launch = verify_gpu(compact_buffers(sch.func), target)
        assert launch.threads > 1, f"{func.name} runs on one thread"
        check_on_cpu(func, sch.func)
