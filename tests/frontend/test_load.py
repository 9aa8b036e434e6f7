"""load_model: zoo names (with suggestions for unknown ones), .hexir files with their .npz,
.onnx files."""

from __future__ import annotations

import numpy as np
import pytest

from hexir.errors import ModelError, ParseError
from hexir.frontend.load import load_model, save_model
from hexir.frontend.onnx_export import export_onnx
from hexir.frontend.zoo import bert, zoo_model
from hexir.graph.evaluate import evaluate


def test_zoo_names():
    assert load_model("mlp") is zoo_model("mlp")
    assert load_model("GPT2_Decode").name == "gpt2-decode"  # case and _ for - forgiven


@pytest.mark.parametrize(
    "name, suggested",
    [("resnet19", "'resnet18' or 'resnet50'"), ("bert", "'bert-base'"), ("gtp2", "'gpt2'")],
)
def test_unknown_names_suggest_close_ones(name, suggested):
    with pytest.raises(ModelError) as info:
        load_model(name)
    message = str(info.value)
    assert f"no model named {name!r}" in message and f"Did you mean {suggested}?" in message
    assert "mlp, resnet18, resnet50, mobilenet-v2, bert-base, vit, gpt2, gpt2-decode" in message
    assert "\n" not in message


def test_nothing_close_suggests_nothing():
    with pytest.raises(ModelError) as info:
        load_model("xyzzy")
    assert "Did you mean" not in str(info.value)


def test_hexir_file_with_its_npz(tmp_path, rng):
    graph = bert(seq=4, hidden=16, heads=2, ffn=32)
    path = tmp_path / "bert.hexir"
    save_model(graph, path)
    assert (tmp_path / "bert.npz").exists()
    loaded = load_model(str(path))
    assert loaded == graph
    x = rng.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(loaded, [x])[0], evaluate(graph, [x])[0])


def test_hexir_file_without_its_npz(tmp_path):
    path = tmp_path / "bert.hexir"
    save_model(bert(seq=4, hidden=16, heads=2, ffn=32), path)
    (tmp_path / "bert.npz").unlink()
    with pytest.raises(ParseError, match="no data for constant"):
        load_model(path)


def test_small_hexir_file_needs_no_npz(tmp_path):
    path = tmp_path / "tiny.hexir"
    path.write_text(
        "hexir.graph @tiny(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
        "  %c = hexir.constant dense<[1.0, 2.0, 3.0]> : tensor<3xf32>\n"
        "  %y = hexir.mul %x, %c : tensor<3xf32>\n"
        "  hexir.return %y\n"
        "}\n"
    )
    (y,) = evaluate(load_model(path), [np.ones(3, np.float32)])
    np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])


def test_onnx_file(tmp_path, rng):
    graph = bert(seq=4, hidden=16, heads=2, ffn=32)
    path = tmp_path / "bert.onnx"
    export_onnx(graph, path)
    loaded = load_model(path)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(evaluate(loaded, [x])[0], evaluate(graph, [x])[0], rtol=1e-6)


def test_files_that_are_not_models(tmp_path):
    with pytest.raises(ModelError, match="no such .hexir file"):
        load_model(tmp_path / "missing.hexir")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00")
    with pytest.raises(ModelError, match="neither a .hexir nor an .onnx"):
        load_model(other)
    kernel = tmp_path / "kernel.hexir"
    kernel.write_text(
        "hextir.func @k(%A: buffer<4xf32>) {\n  for %i in 0..4 serial {\n    %A[%i] = 1.0\n  }\n}\n"
    )
    with pytest.raises((ModelError, ParseError)):
        load_model(kernel)
