"""`load_model`: a zoo name, a `.hexir` text file (constants from the `.npz` beside it) or an
`.onnx` file, as a Hexir graph; `save_model` writes the `.hexir` + `.npz` pair."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from hexir.errors import ModelError
from hexir.frontend.zoo import ZOO, zoo_model
from hexir.ir.graph import Graph

__all__ = ["load_model", "save_model", "load_hexir"]


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    dims: Mapping[str, int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    symbolic: bool = False,
) -> Graph:
    """A zoo model by name (`resnet18`, ...; see `hexir.frontend.zoo`), or a `.hexir` or
    `.onnx` file. `dims` and `input_shapes` fix an ONNX model's symbolic dims (`import_onnx`),
    `symbolic` keeps those they leave free. A .hexir file with symbolic dims (`{seq}`) is
    specialized to the sizes `dims` and `input_shapes` give its symbols, all of them (or kept
    symbolic without any); the zoo's models have fixed shapes, and refuse them."""
    text = os.fspath(name_or_path)
    name = _zoo_name(text)
    path = Path(text)
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        from hexir.frontend.onnx_import import import_onnx

        return import_onnx(path, dims=dims, input_shapes=input_shapes, symbolic=symbolic)
    if suffix == ".hexir" and name is None:
        return _sized(load_hexir(path), text, dims or {}, input_shapes or {})
    if dims or input_shapes:
        raise _static(text, [*(dims or {}), *(input_shapes or {})])
    if name is not None:
        return zoo_model(name)
    if suffix == ".hexir":
        return load_hexir(path)
    if path.exists():
        raise ModelError(
            f"{path} is neither a .hexir nor an .onnx file; load_model reads those two kinds "
            "of file (by their suffix) and the zoo's models by name."
        )
    raise ModelError(_unknown(text))


def _sized(
    graph: Graph, text: str, dims: Mapping[str, int], shapes: Mapping[str, Sequence[int]]
) -> Graph:
    """A .hexir model at the sizes given to its symbols (as it is without any)."""
    from hexir.graph.specialize import graph_symbols, specialize, symbol_sizes

    if not dims and not shapes:
        return graph
    symbols = graph_symbols(graph)
    if not symbols and not dims:  # the inputs' shapes alone: checked when it runs
        return graph
    if not symbols:
        raise _static(text, list(dims))
    sizes = dict(dims)
    if shapes:
        missing = [v.name for v in graph.inputs if v.name not in shapes]
        if missing:
            raise ModelError(f"{text}: no input shape for {', '.join(missing)}")
        sizes.update(symbol_sizes(graph, shapes))
    unknown = sorted(set(sizes) - symbols)
    missing = sorted(symbols - set(sizes))
    if unknown or missing:
        raise ModelError(
            f"{text} has the symbolic dims {', '.join(sorted(symbols))}: "
            + (f"it has no {', '.join(unknown)}; " if unknown else "")
            + (f"give {' '.join(f'--dim {m}=SIZE' for m in missing)}" if missing else "")
            + " (every one of them, or none with `hexir build --dynamic`)"
        )
    return specialize(graph, sizes)


def _static(text: str, given: list[str]) -> ModelError:
    return ModelError(
        f"{text} has static shapes: sizes for symbolic dims or input shapes ({', '.join(given)}) "
        "apply only to a model with symbolic dims (an .onnx exported with dynamic axes, a "
        ".hexir with {seq}); drop them"
    )


def _zoo_name(text: str) -> str | None:
    """The zoo name `text` means: exact, or up to case and `_` for `-`."""
    if text in ZOO:
        return text
    folded = text.lower().replace("_", "-")
    return folded if folded in ZOO else None


def _unknown(text: str) -> str:
    folded = text.lower().replace("_", "-")
    close = difflib.get_close_matches(folded, list(ZOO), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (
        f"no model named {text!r}: it is not in the zoo ({', '.join(ZOO)}) and not an "
        f"existing .hexir or .onnx file.{hint}"
    )


def load_hexir(path: str | os.PathLike[str]) -> Graph:
    """A graph from its text, its large constants from the `.npz` with the same stem."""
    from hexir.ops.parse import parse

    path = Path(path)
    if not path.exists():
        raise ModelError(f"no such .hexir file: {path}")
    blobs_path = path.with_suffix(".npz")
    blobs = None
    if blobs_path.exists():
        with np.load(blobs_path, allow_pickle=False) as archive:
            blobs = {key: archive[key] for key in archive.files}
    graph = parse(path.read_text(), constants=blobs)
    if not isinstance(graph, Graph):
        raise ModelError(f"{path} holds a hextir kernel, not a hexir.graph model")
    return graph


def save_model(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write `graph` as `path` (text, `.hexir`) and its constants as the `.npz` beside it."""
    path = Path(path)
    if path.suffix != ".hexir":
        raise ModelError(f"save_model writes a .hexir file, got {path}")
    path.write_text(str(graph) + "\n")
    arrays = {name: data.array for name, data in graph.constants}
    np.savez(path.with_suffix(".npz"), **arrays)  # type: ignore[arg-type]
