"""A whole compiled module on the GPU: the memory plan, fused and unfused, against numpy."""

from __future__ import annotations

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
