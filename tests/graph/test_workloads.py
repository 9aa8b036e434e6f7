"""`hexir.workload`: the named workloads of DESIGN.md §9 and single ops by name."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.errors import HexirError
from hexir.graph.workloads import WORKLOADS, workload
from hexir.ir.tir import Block
from hexir.ir.visit import walk


def params(func):
    return [(p.name, p.shape, p.dtype) for p in func.params]


def block_names(func):
    return [n.name for n in walk(func.body) if isinstance(n, Block)]


def test_named_workloads_params_and_blocks():
    f32 = "float32"
    cases = [
        (
            workload("matmul", M=8, N=6, K=4),
            [("A", (8, 4), f32), ("B", (4, 6), f32), ("C", (8, 6), f32)],
            ["matmul"],
        ),
        (
            workload("batch_matmul", B=2, M=3, N=5, K=4),
            [("A", (2, 3, 4), f32), ("B", (2, 4, 5), f32), ("C", (2, 3, 5), f32)],
            ["batch_matmul"],
        ),
        (
            workload("dense", M=4, N=5, K=3),
            [("X", (4, 3), f32), ("W", (5, 3), f32), ("bias", (5,), f32), ("Y", (4, 5), f32)],
            ["dense", "bias_add"],
        ),
        (
            workload("conv2d", N=1, C=4, H=8, W=8, K=6, R=3, S=3, stride=2, padding=1, groups=2),
            [("X", (1, 4, 8, 8), f32), ("W", (6, 2, 3, 3), f32), ("Y", (1, 6, 4, 4), f32)],
            ["conv2d_pad", "conv2d"],  # padded: a zero-bordered copy, then the contraction
        ),
        (
            workload("softmax", M=4, N=8),
            [("X", (4, 8), f32), ("Y", (4, 8), f32)],
            ["softmax_max", "softmax_exp", "softmax_sum", "softmax_norm"],
        ),
        (
            workload("log_softmax", M=4, N=8),
            [("X", (4, 8), f32), ("Y", (4, 8), f32)],
            ["log_softmax_max", "log_softmax_sum", "log_softmax_norm"],
        ),
        (
            workload("layer_norm", M=4, N=8),
            [("X", (4, 8), f32), ("gamma", (8,), f32), ("beta", (8,), f32), ("Y", (4, 8), f32)],
            ["layer_norm_mean", "layer_norm_var", "layer_norm_norm"],
        ),
        (
            workload("rms_norm", M=4, N=8),
            [("X", (4, 8), f32), ("scale", (8,), f32), ("Y", (4, 8), f32)],
            ["rms_norm_meansq", "rms_norm_norm"],
        ),
        (
            workload("reduce_sum", M=4, N=8),
            [("X", (4, 8), f32), ("Y", (4,), f32)],
            ["reduce_sum"],
        ),
    ]
    assert {f.name for f, _, _ in cases} == set(WORKLOADS)
    for func, expected_params, expected_blocks in cases:
        assert params(func) == expected_params, func.name
        assert block_names(func) == expected_blocks, func.name
        assert func.num_outputs == 1
        hexir.verify(func)
        assert hexir.parse(str(func)) == func


def test_dense_activations_are_one_func():
    assert block_names(workload("dense", M=2, N=3, K=4, activation="relu")) == [
        "dense",
        "bias_add",
        "relu",
    ]
    func = workload("dense", M=2, N=3, K=4, bias=False, activation="gelu", approximate="tanh")
    assert block_names(func) == ["dense", "gelu"]
    assert [p.name for p in func.params] == ["X", "W", "Y"]
    assert 'approximate = \\"tanh\\"' in str(func)


def test_defaults_and_dtype():
    func = workload("conv2d", N=1, C=2, H=5, W=5, K=3, R=3, S=3)
    source = func.attr("source")
    for attr in ("stride = (1, 1)", "padding = (0, 0)", "dilation = (1, 1)", "groups = 1"):
        assert attr in source
    assert "epsilon = 1e-05" in workload("layer_norm", M=2, N=3).attr("source")
    func = workload("matmul", M=2, N=3, K=4, dtype="float64")
    assert {p.dtype for p in func.params} == {"float64"}
    assert workload("matmul", M=2, N=3, K=4) == workload("matmul", K=4, N=3, M=2)
    assert hexir.workload is workload


def test_single_ops_by_name():
    func = workload("relu", shape=(4, 8))
    assert params(func) == [("in0", (4, 8), "float32"), ("out0", (4, 8), "float32")]
    func = workload("add", "int32", shapes=[(4, 8), (8,)])
    assert params(func) == [
        ("in0", (4, 8), "int32"),
        ("in1", (8,), "int32"),
        ("out0", (4, 8), "int32"),
    ]
    func = workload("where", shapes=[(4,), (4,), (1,)])
    assert [p.dtype for p in func.params] == ["bool", "float32", "float32", "float32"]
    func = workload("reduce_max", shape=(3, 4), axes=1, keepdims=True)
    assert func.outputs[0].shape == (3, 1)
    func = workload("cast", shape=(3,), attrs={"dtype": "int64"})
    assert func.outputs[0].dtype == "int64"
    func = workload("reshape", shape=(2, 6), attrs={"shape": (3, -1)})
    assert func.outputs[0].shape == (3, 4)
    # shape= selects the single-op form for the named workloads too
    assert params(workload("softmax", shape=(2, 3), axis=0))[0] == ("in0", (2, 3), "float32")


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("nope", {}, "unknown workload 'nope'.*matmul, batch_matmul"),
        ("matmul", {"M": 2, "N": 2}, "missing keyword.*K.*takes M, N, K"),
        ("matmul", {"M": 2, "N": 2, "K": 2, "L": 1}, "unknown keyword.*L"),
        ("conv2d", {"N": 1, "C": 2, "H": 4, "W": 4, "K": 2, "R": 3}, "missing.*S.*stride=1"),
        ("matmul", {"M": 0, "N": 2, "K": 2}, "M must be a positive int"),
        ("matmul", {"M": 2.5, "N": 2, "K": 2}, "M must be a positive int"),
        ("matmul", {"M": 2, "N": 2, "K": 2, "dtype": "float33"}, "unknown dtype"),
        ("dense", {"M": 2, "N": 2, "K": 2, "activation": "swish"}, "activation"),
        ("conv2d", {"N": 1, "C": 3, "H": 4, "W": 4, "K": 2, "R": 3, "S": 3, "groups": 2}, "groups"),
        ("frobnicate", {"shape": (2,)}, "unknown op 'frobnicate'"),
        ("relu", {"shape": (2,), "shapes": [(2,)]}, "not both"),
        ("relu", {"shape": (2,), "axis": 1}, "unknown attribute"),
    ],
)
def test_errors(name, kwargs, message):
    with pytest.raises(HexirError, match=message):
        workload(name, **kwargs)


def test_workloads_compute_what_they_say(rng):
    func = workload("dense", M=3, N=4, K=5, activation="relu")
    x, w, b = (rng.standard_normal(p.shape).astype(np.float32) for p in func.inputs)
    y = np.full((3, 4), np.nan, np.float32)
    hexir.build(func)(x, w, b, y)
    np.testing.assert_allclose(y, np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)
    func = workload("layer_norm", M=3, N=8, eps=1e-3)
    x, g, b = (rng.standard_normal(p.shape).astype(np.float32) for p in func.inputs)
    y = np.full((3, 8), np.nan, np.float32)
    hexir.build(func)(x, g, b, y)
    mean, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-3) * g + b, rtol=1e-4, atol=1e-4)
