"""A whole compiled module on the GPU: the memory plan, fused and unfused, against numpy; its
profile, every launch timed by CUDA events."""

from __future__ import annotations

import math

import numpy as np
import pytest

import hexir
from hexir.frontend import zoo
from hexir.graph.evaluate import evaluate

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_a_cuda_module_runs_on_the_gpu_from_its_plan(fusion):
    graph = zoo.bert(seq=8, hidden=32, heads=2, ffn=64)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]
    with hexir.knobs.scope(fusion=fusion):
        module = hexir.compile(graph, target="cuda")
    planned = module.run(inputs)
    again = module.run(inputs)
    unplanned = module.run(inputs, plan=False)
    expected = evaluate(graph, inputs)
    assert len(planned) == len(again) == len(unplanned) == len(expected)
    for out, same, other, ref in zip(planned, again, unplanned, expected, strict=True):
        np.testing.assert_array_equal(out, same)
        np.testing.assert_array_equal(out, other)
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(ref).max()))


def test_a_cuda_module_profiles_every_launch_in_place(rng):
    graph = zoo.mlp(batch=8, sizes=(64, 32, 10))
    inputs = [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]
    module = hexir.compile(graph, target="cuda")
    profile = module.profile(inputs, repeats=3, warmup=1)
    assert sorted(r.index for r in profile.rows) == list(range(len(module.commands)))
    assert all(r.seconds > 0 and math.isfinite(r.seconds) for r in profile.rows)
    assert sum(r.share for r in profile.rows) == pytest.approx(1.0)
    assert "SMs" in profile.peak.how and "sum of commands" in str(profile)
    expected = evaluate(graph, inputs)
    for got in (profile.outputs, module.run(inputs)):
        for out, ref in zip(got, expected, strict=True):
            np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4)


def test_a_cuda_graph_replays_the_command_list_on_new_inputs(rng):
    """The first planned run captures the launches as a CUDA graph, later runs replay it: the
    same bits as launching one by one, on each run's own inputs."""
    from hexir.runtime.cuda_driver import load
    from hexir.runtime.cuda_module import cuda_buffers

    graph = zoo.gpt2_decode(past=7, hidden=32, heads=2)
    module = hexir.compile(graph, target="cuda")
    for _ in range(3):  # capture, then replays on fresh inputs
        inputs = [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]
        with hexir.knobs.scope(cuda_graphs=True):
            replayed = module.run(inputs)
        with hexir.knobs.scope(cuda_graphs=False):
            eager = module.run(inputs)
        for out, same, ref in zip(replayed, eager, evaluate(graph, inputs), strict=True):
            np.testing.assert_array_equal(out, same)
            np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(ref).max()))
    assert (cuda_buffers(module).graph is not None) == load().supports_graphs
