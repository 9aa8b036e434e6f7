"""Models in and out of Hexir: the zoo, `.hexir` files, ONNX import and export.

    graph = load_model("resnet18")          # a zoo name, a .hexir file or an .onnx file
    export_onnx(graph, "resnet18.onnx")     # standard ONNX (opset 17) that peers can run
    graph = import_onnx("resnet18.onnx")

onnx is imported only where ONNX is read or written.
"""

from hexir.frontend.load import load_hexir, load_model, save_model
from hexir.frontend.onnx_export import OPSET, export_onnx
from hexir.frontend.onnx_import import SUPPORTED, import_onnx
from hexir.frontend.zoo import ZOO, bert, gpt2, gpt2_decode, mlp, resnet, zoo_model

__all__ = [
    "OPSET",
    "SUPPORTED",
    "ZOO",
    "bert",
    "export_onnx",
    "gpt2",
    "gpt2_decode",
    "import_onnx",
    "load_hexir",
    "load_model",
    "mlp",
    "resnet",
    "save_model",
    "zoo_model",
]
