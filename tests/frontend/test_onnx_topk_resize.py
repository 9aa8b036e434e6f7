"""ONNX import of TopK (rounds of argmax/argmin and a gather) and of Resize in its linear and
cubic modes (a weighted sum of gathers per resized axis): each imported model computes what
onnx's reference evaluator computes on fresh random inputs, evaluated and compiled for the CPU,
and what Hexir cannot import is refused naming why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from seeding import current_rng
from test_onnx_import import kinds, model
from test_onnx_import_ops import compiled_agrees, uniform
from test_onnx_node_cases import _with_named_constants, supported_cases

import hexir
from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate

# --- TopK -------------------------------------------------------------------------------------


def topk_model(shape, k: int, elem_type=TensorProto.FLOAT, **attrs):
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], **attrs)
    k_array = np.asarray([k], np.int64)
    return model([node], [("x", shape, elem_type)], ["values", "indices"], [("k", k_array)])


def ties(*shape: int) -> np.ndarray:
    """Few distinct values, so that most elements tie with others."""
    return (current_rng().integers(-2, 3, shape) * 0.75).astype(np.float32)


@pytest.mark.parametrize("k, attrs", [(3, {}), (1, {"axis": 0}), (5, {"axis": -1, "largest": 0}),
                                      (4, {"axis": 1, "sorted": 0}), (6, {"axis": 2})])  # fmt: skip
def test_topk_orders_ties_by_index_and_gives_int64_indices(k, attrs):
    proto = topk_model([4, 5, 6], k, **attrs)
    graph = compiled_agrees(proto, [ties(4, 5, 6)], rtol=0, atol=0)
    assert graph.outputs[1].type.dtype == "int64"
    assert kinds(graph)["gather_elements"] == k  # the values' gather, one per later round


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_past_the_infinities_picks_each_index_once(largest):
    """Masked logits: where every element left is the masking value (-inf for the largest),
    the rounds still take the untaken ones, in index order."""
    x = uniform(3, 7)
    worst = -np.inf if largest else np.inf
    x[:, ::2] = worst
    x[1, :] = worst
    compiled_agrees(topk_model([3, 7], 7, largest=largest), [x], rtol=0, atol=0)


def test_topk_of_ints_masks_with_their_extremes():
    x = current_rng().integers(-3, 3, (2, 6, 3)).astype(np.int32)
    x[0, :, 0] = np.iinfo(np.int32).min
    proto = topk_model([2, 6, 3], 6, TensorProto.INT32, axis=1)
    compiled_agrees(proto, [x], rtol=0, atol=0)


@pytest.mark.parametrize("k, why", [(0, "k 0"), (6, "k 6 along an axis of 5")])
def test_topk_refuses_a_k_outside_the_axis(k, why):
    with pytest.raises(ModelError, match=why):
        import_onnx(topk_model([3, 5], k))


def test_topk_refuses_a_k_computed_at_run_time():
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"])
    proto = model([node], [("x", [3, 5]), ("k", [1], TensorProto.INT64)], ["values", "indices"])
    with pytest.raises(ModelError, match="K.*must be a constant"):
        import_onnx(proto)


# --- Resize -----------------------------------------------------------------------------------


def resize_model(shape, scales=None, sizes=None, roi=None, **attrs):
    inputs = ["x", "roi" if roi is not None else "", "scales" if scales is not None else ""]
    constants = [(n, np.asarray(a, np.float32)) for n, a in (("roi", roi), ("scales", scales))
                 if a is not None]  # fmt: skip
    if sizes is not None:
        inputs.append("sizes")
        constants.append(("sizes", np.asarray(sizes, np.int64)))
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    return model([node], [("x", shape)], ["y"], constants, opset=19)


COORDINATES = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
               "half_pixel_symmetric"]  # fmt: skip


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", COORDINATES)
def test_resize_interpolates_each_spatial_axis(mode, coordinates):
    """Up along one axis by a scale whose output length is not whole, down along the other."""
    proto = resize_model([2, 3, 5, 6], scales=[1, 1, 1.7, 0.6], mode=mode,
                         coordinate_transformation_mode=coordinates)  # fmt: skip
    graph = compiled_agrees(proto, [uniform(2, 3, 5, 6)])
    taps = 2 if mode == "linear" else 4
    assert kinds(graph)["gather"] <= 2 * taps


@pytest.mark.parametrize("attrs", [{"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5},
                                   {"mode": "linear", "antialias": 1},
                                   {"mode": "cubic", "antialias": 1},
                                   {"mode": "linear", "exclude_outside": 1}])  # fmt: skip
def test_resize_downsamples_with_the_kernel_options(attrs):
    proto = resize_model([1, 2, 9, 7], sizes=[1, 2, 4, 3], **attrs)
    compiled_agrees(proto, [uniform(1, 2, 9, 7)])


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_sizes_along_axes_keep_the_aspect_ratio(policy):
    proto = resize_model([2, 6, 4], sizes=[9, 5], axes=[2, 1], mode="linear",
                         keep_aspect_ratio_policy=policy)  # fmt: skip
    compiled_agrees(proto, [uniform(2, 6, 4)])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_crops_and_fills_outside_the_input(mode):
    """tf_crop_and_resize: a region of interest that reaches past the input on one side."""
    proto = resize_model([1, 1, 5, 6], sizes=[1, 1, 4, 7], roi=[0, 0, -0.2, 0.3, 1, 1, 0.8, 1.2],
                         mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                         extrapolation_value=2.5)  # fmt: skip
    graph = compiled_agrees(proto, [uniform(1, 1, 5, 6)])
    assert kinds(graph)["where"] == 2


def test_resize_linear_of_ints_is_refused():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    scales = np.asarray([1, 2], np.float32)
    proto = model([node], [("x", [2, 3], TensorProto.INT32)], ["y"], [("scales", scales)])
    with pytest.raises(ModelError, match="Resize linear of int32"):
        import_onnx(proto)


# --- ONNX's node cases, their runtime inputs made constants -----------------------------------


# The cases are built when a test first needs them, not when pytest collects this module:
# building ONNX's node cases takes 8-12 s, which every pytest process (each xdist worker, the
# serial run) paid at collection. A test for each of CONSTANT_SHARDS slices of them.
CONSTANT_SHARDS = 4
# Resize and TopK cases on 2026-12-07 (onnx 1.23): a floor, so that losing them shows.
CONSTANT_CASES_AT_LEAST = 45


def _constant_case_names() -> list[str]:
    """Every Resize and TopK case but uint64's (Hexir has no such dtype)."""
    names = [c.name for c in supported_cases() if c.name.startswith(("test_resize", "test_top_k"))]
    return [name for name in names if "uint64" not in name]


@pytest.mark.parametrize("shard", range(CONSTANT_SHARDS))
def test_node_cases_with_constant_scales_sizes_and_k_compute_the_same_compiled(shard):
    names = _constant_case_names()
    assert len(names) >= CONSTANT_CASES_AT_LEAST
    for name in names[shard::CONSTANT_SHARDS]:
        (case,) = [c for c in supported_cases() if c.name == name]
        runtime = {i.name for i in case.model.graph.input[1:]}  # roi, scales, sizes; or K
        proto, inputs, expected = _with_named_constants(case, runtime)
        graph = import_onnx(proto)
        rtol, atol = case.rtol or 1e-3, case.atol or 1e-5
        for got in (evaluate(graph, inputs), hexir.compile(graph, target="cpu").run(inputs)):
            for g, want in zip(got, expected, strict=True):
                np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=name)
