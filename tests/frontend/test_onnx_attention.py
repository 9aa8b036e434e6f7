"""ONNX import of opset 23's Attention and RotaryEmbedding, compositions of Hexir's ops: each
imported model computes what onnx's reference evaluator computes on fresh random inputs,
evaluated and compiled for the CPU, and what Hexir cannot import is refused naming it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from seeding import current_rng
from test_onnx_import import kinds, model
from test_onnx_import_ops import compiled_agrees, uniform

import hexir
from hexir.errors import ModelError
from hexir.frontend.onnx_import import import_onnx
from hexir.graph.evaluate import evaluate

B = TensorProto.BOOL
OUTPUTS = ["y", "present_key", "present_value", "qk"]


def attention(inputs, attrs, outputs=1, inits=()):
    """An opset-23 model of one Attention node over `inputs` ((name, shape[, type]); "" for an
    input left out), its first `outputs` outputs asked for."""
    names = [i[0] for i in inputs]
    node = helper.make_node("Attention", names, OUTPUTS[:outputs], **attrs)
    given = [i for i in inputs if i[0] and i[0] not in dict(inits)]
    return model([node], given, OUTPUTS[:outputs], inits, opset=23)


def random_for(proto) -> list[np.ndarray]:
    """Fresh inputs for the graph inputs of `proto`: uniform floats, random bools (a mask)."""
    rng = current_rng()
    arrays = []
    for info in proto.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.type.tensor_type.elem_type == B:
            arrays.append(rng.random(shape) < 0.7)
        else:
            arrays.append(uniform(*shape))
    return arrays


QKV4 = [("q", [2, 3, 4, 8]), ("k", [2, 3, 6, 8]), ("v", [2, 3, 6, 5])]
GQA4 = [("q", [2, 6, 4, 8]), ("k", [2, 2, 6, 8]), ("v", [2, 2, 6, 8])]
QKV3 = [("q", [2, 4, 24]), ("k", [2, 6, 8]), ("v", [2, 6, 10])]  # 6 query heads over 2
PAST = [("past_key", [2, 3, 3, 8]), ("past_value", [2, 3, 3, 5])]

ATTENTION = {
    "4-D": (QKV4, {}, 1),
    "grouped, causal": (GQA4, {"is_causal": 1}, 1),
    "3-D grouped, scaled": (QKV3, {"q_num_heads": 6, "kv_num_heads": 2, "scale": 0.3}, 1),
    "3-D causal, softcap": (QKV3, {"q_num_heads": 6, "kv_num_heads": 2, "is_causal": 1,
                                   "softcap": 1.5}, 1),
    "bool mask": ([*QKV4, ("m", [4, 6], B)], {}, 1),
    "float mask 3-D, causal": ([*GQA4, ("m", [6, 4, 6])], {"is_causal": 1}, 1),
    "past, present": ([*QKV4, ("m", [2, 1, 4, 9]), *PAST], {"is_causal": 1}, 3),
    "past, no mask": ([*QKV4, ("",), *PAST], {}, 3),
    "past, a short mask padded": ([*QKV4, ("m", [4, 6], B), *PAST], {}, 3),
    "scores, softcapped": (QKV4, {"softcap": 0.8, "qk_matmul_output_mode": 1}, 4),
    "scores with the bias": ([*QKV4, ("m", [4, 6])], {"qk_matmul_output_mode": 2}, 4),
    "probabilities": ([*QKV4, ("m", [4, 6], B)], {"is_causal": 1, "qk_matmul_output_mode": 3}, 4),
    "softmax in float64": (QKV4, {"softmax_precision": TensorProto.DOUBLE}, 1),
}  # fmt: skip


@pytest.mark.parametrize("inputs,attrs,outputs", ATTENTION.values(), ids=ATTENTION.keys())
def test_attention_computes_what_onnx_does(inputs, attrs, outputs):
    proto = attention(inputs, attrs, outputs)
    graph = compiled_agrees(proto, random_for(proto), rtol=1e-5, atol=1e-6)
    assert kinds(graph)["batch_matmul"] == 2  # grouped heads are not repeated


def test_a_fully_masked_row_gives_zeros_not_nan():
    proto = attention([*QKV4, ("m", [4, 6], B)], {"qk_matmul_output_mode": 3}, outputs=4)
    q, k, v, mask = random_for(proto)
    mask[2] = False
    compiled_agrees(proto, [q, k, v, mask])
    y = evaluate(import_onnx(proto), [q, k, v, mask])[0]
    assert not np.isnan(y).any() and not y[:, :, 2].any()


def test_constant_masks_decide_at_import_which_rows_are_empty():
    proto = attention(QKV4, {"is_causal": 1})  # every row sees key 0
    assert "reduce_max" not in kinds(import_onnx(proto))
    mask = np.ones((4, 6), bool)
    mask[1] = False
    proto = attention([*QKV4, ("m",)], {}, inits=[("m", mask)])
    graph = compiled_agrees(proto, random_for(proto))
    assert "reduce_max" not in kinds(graph) and "where" in kinds(graph)


def test_the_raw_scores_are_before_the_softcap_as_the_spec_says():
    """qk_matmul_output_mode 0 is Q·Kᵀ scaled (the spec, and ONNX's function body); onnx's
    reference evaluator gives the softcapped scores instead, so numpy checks this one."""
    proto = attention(QKV4, {"softcap": 0.5}, outputs=4)
    q, k, v = random_for(proto)
    root = np.float32(np.sqrt(1 / np.sqrt(8)))
    want = (q * root) @ np.swapaxes(k * root, 2, 3)
    graph = import_onnx(proto)
    for got in (evaluate(graph, [q, k, v]), hexir.compile(graph, target="cpu").run([q, k, v])):
        np.testing.assert_allclose(got[3], want, rtol=1e-5, atol=1e-6)
    reference = ReferenceEvaluator(proto).run(None, {"q": q, "k": k, "v": v})[3]
    assert not np.allclose(reference, want)  # if this fails, onnx fixed it: compare with it


def test_float16_attention_rounds_its_softmax_per_step_as_onnx_does():
    inputs = [(n, s, TensorProto.FLOAT16) for n, s in GQA4]
    proto = attention(inputs, {"is_causal": 1})
    arrays = [a.astype(np.float16) for a in random_for(proto)]
    want = ReferenceEvaluator(proto).run(None, dict(zip("qkv", arrays, strict=True)))[0]
    np.testing.assert_allclose(evaluate(import_onnx(proto), arrays)[0], want, rtol=1e-3, atol=0)


@pytest.mark.parametrize("inputs,attrs,why", [
    (QKV3, {}, "needs q_num_heads"),
    (QKV3, {"q_num_heads": 5, "kv_num_heads": 2}, "needs q_num_heads dividing"),
    (QKV3, {"q_num_heads": 4, "kv_num_heads": 2}, "Attention of Q"),  # heads of 6 and 4
    ([("q", [2, 3, 4, 8]), ("k", [2, 2, 6, 8]), ("v", [2, 2, 6, 8])], {}, "3 query heads over 2"),
    ([*QKV4, ("m", [4, 6], TensorProto.INT32)], {}, "attn_mask of int32"),
    ([*QKV4, ("m", [4, 1])], {}, "against 6 keys"),
    ([*QKV4, ("",), ("past_key", [2, 3, 3, 8])], {}, "past_key and past_value"),
    (QKV4, {"qk_matmul_output_mode": 4}, "qk_matmul_output_mode=4"),
    (QKV4, {"q_num_heads": 2}, "q_num_heads=2 for a 4-D Q of 3 heads"),
])  # fmt: skip
def test_attention_refuses_what_it_cannot_mean(inputs, attrs, why):
    with pytest.raises(ModelError, match=why):
        import_onnx(attention(inputs, attrs))


# --- RotaryEmbedding --------------------------------------------------------------------------


def rotary(x_shape, cache_shape, attrs, positions=True, inits=()):
    inputs = [("x", x_shape), ("cos", cache_shape), ("sin", cache_shape)]
    if positions:
        inputs.append(("pos", list(x_shape[:1]) + [x_shape[-2 if len(x_shape) == 4 else 1]],
                       TensorProto.INT64))  # fmt: skip
    names = [i[0] for i in inputs]
    node = helper.make_node("RotaryEmbedding", names, ["y"], **attrs)
    given = [i for i in inputs if i[0] not in dict(inits)]
    return model([node], given, ["y"], inits, opset=23)


def rotary_inputs(proto) -> list[np.ndarray]:
    rng = current_rng()
    arrays = []
    for info in proto.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if info.name == "pos":
            arrays.append(rng.integers(0, 10, shape).astype(np.int64))
        else:
            arrays.append(uniform(*shape))
    return arrays


ROTARY = {
    "4-D": ([2, 3, 5, 8], [10, 4], {}, True),
    "interleaved": ([2, 3, 5, 8], [10, 4], {"interleaved": 1}, True),
    "partial": ([2, 3, 5, 8], [10, 2], {"rotary_embedding_dim": 4}, True),
    "partial, interleaved": ([2, 3, 5, 8], [10, 3], {"rotary_embedding_dim": 6,
                                                     "interleaved": 1}, True),
    "3-D": ([2, 5, 24], [10, 3], {"num_heads": 4}, True),
    "3-D partial, interleaved": ([2, 5, 24], [10, 2], {"num_heads": 4, "interleaved": 1,
                                                       "rotary_embedding_dim": 4}, True),
    "no positions": ([2, 3, 5, 8], [2, 5, 4], {}, False),
    "no positions, 3-D interleaved": ([2, 5, 24], [2, 5, 3], {"num_heads": 4,
                                                              "interleaved": 1}, False),
}  # fmt: skip


@pytest.mark.parametrize("x,cache,attrs,positions", ROTARY.values(), ids=ROTARY.keys())
def test_rotary_embedding_computes_what_onnx_does(x, cache, attrs, positions):
    proto = rotary(x, cache, attrs, positions)
    graph = compiled_agrees(proto, rotary_inputs(proto), rtol=1e-6, atol=1e-6)
    assert ("gather" in kinds(graph)) == positions


def test_rotary_embedding_of_constant_caches_gathers_at_run_time():
    """A model's usual form: the caches are initializers, the positions an input."""
    angles = np.outer(np.arange(10), 1e-1 ** np.arange(4)).astype(np.float32)
    caches = [("cos", np.cos(angles)), ("sin", np.sin(angles))]
    proto = rotary([1, 2, 5, 8], [10, 4], {}, inits=caches)
    graph = compiled_agrees(proto, rotary_inputs(proto), rtol=1e-6, atol=1e-6)
    assert kinds(graph)["gather"] == 2


@pytest.mark.parametrize("x,cache,attrs,positions,why", [
    ([2, 5, 24], [10, 3], {}, True, "needs num_heads"),
    ([2, 3, 5, 8], [10, 4], {"rotary_embedding_dim": 5}, True, "rotary_embedding_dim=5"),
    ([2, 3, 5, 8], [10, 3], {}, True, "cos_cache .* with position_ids"),
    ([2, 3, 5, 8], [5, 4], {}, False, "cos_cache .* without position_ids: rank 3"),
])  # fmt: skip
def test_rotary_embedding_refuses_what_it_cannot_mean(x, cache, attrs, positions, why):
    with pytest.raises(ModelError, match=why):
        import_onnx(rotary(x, cache, attrs, positions))
