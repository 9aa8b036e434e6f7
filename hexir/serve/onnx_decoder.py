"""Greedy generation with a decoder exported to ONNX with past key/values, as Hugging Face
exports them: input_ids, attention_mask and position_ids in, with past_key_values.<i>.key and
.value [batch, heads, past, head_dim]; logits and present.<i>.key and .value out.

    decoder = OnnxDecoder("tests/frontend/fixtures/gpt2_tiny_past.onnx")
    decoder.generate([7, 42, 3], max_new_tokens=8)     # the 8 new token ids
    decoder.module             # a SymbolicModule: the specializations compiled so far

The model is imported once with its batch bound to 1 and its other dims symbolic
(`import_onnx(path, dims={batch: 1}, symbolic=True)`; the batch is bound because the export
flattens batch and sequence together before each linear layer, and a product of two symbols
is no dimension) and compiled to one `SymbolicModule`.
The prompt is prefilled in one call, then every new token is one call that feeds the
presents back as the past.

The past is padded to a bucket of lengths (a multiple of `bucket`, 16 by default) and the
attention mask hides the padding, so one specialization serves every cache length of a
bucket: the prefill at the prompt's length, then a decode step per bucket. Each call's new
keys and values are the presents after the padded past, and are copied into the cache
after its valid tokens; the position ids say the true positions, so the padding changes
nothing the model computes. The padding is also what makes the first step work: a symbol
is a size of at least 1, so Hexir has no empty past; the prefill runs on a past of padding
alone, every slot of it masked. `bucket=1` pads only that first step: a specialization per
cache length. (Specializations are kernels of fixed sizes, compiled on first use and then
kept by the build cache; kernels with symbolic extents, one set for every length, are issue
16's next step.)

The model must take attention_mask and position_ids as inputs (without them padding would
move the positions); its batch is 1. Prompt ids are checked against the vocabulary (the
logits' extent); how many positions the model holds is not in the file, so a generation
past them is the caller's to avoid (a kernel clamps an index out of range). Ties in the
argmax go to the lowest token id.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from hexir.errors import HexirError, ModelError
from hexir.ir.dtype import numpy_dtype
from hexir.runtime.target import Target

__all__ = ["OnnxDecoder"]

_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")


@dataclass(frozen=True)
class _Layout:
    """Where the decoder's tensors are among the graph's inputs and outputs (by position)."""

    ids: int
    mask: int
    positions: int
    pasts: tuple[int, ...]  # the past inputs, in the order of `presents`
    logits: int
    presents: tuple[int, ...]
    heads: int
    head_dim: int


class OnnxDecoder:
    """A decoder-only language model exported to ONNX with past key/values, compiled with
    Hexir for greedy generation (module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        bucket: int = 16,
        target: Target | str = "cpu",
        database: object = None,
    ):
        from hexir.frontend.onnx_import import import_onnx, load_proto
        from hexir.runtime.executor import compile

        if bucket < 1:
            raise HexirError(f"bucket must be at least 1, got {bucket}")
        proto, _ = load_proto(path)
        self.layout = _layout(proto, os.fspath(path))
        batch = _batch_dim(proto)
        self.graph = import_onnx(
            proto, dims={batch: 1} if batch else None, symbolic=True, name=_stem(path)
        )
        self.bucket = bucket
        self.module = compile(self.graph, Target.of(target), database)  # type: ignore[arg-type]

    @property
    def vocab(self) -> int:
        """The number of token ids: the logits' last extent."""
        return int(self.graph.outputs[self.layout.logits].type.shape[-1])

    def capacity(self, cached: int) -> int:
        """The padded past's length for `cached` valid tokens: the bucket that holds them, at
        least one bucket (the prefill's past is padding alone)."""
        return self.bucket * max(1, -(-cached // self.bucket))

    def step(
        self, past: list[np.ndarray], cached: int, tokens: list[int]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run `tokens` after the first `cached` tokens of `past` (one array per past input,
        [1, heads, capacity, head_dim], the rest padding): their logits, [len(tokens),
        vocab], and their keys and values, one array per present output."""
        layout, capacity, n = self.layout, past[0].shape[2], len(tokens)
        inputs = self.graph.inputs
        feeds: list[np.ndarray | None] = [None] * len(inputs)
        feeds[layout.ids] = np.asarray([tokens], numpy_dtype(inputs[layout.ids].type.dtype))
        mask = np.zeros((1, capacity + n), numpy_dtype(inputs[layout.mask].type.dtype))
        mask[0, :cached] = mask[0, capacity:] = 1  # the padding in between is hidden
        feeds[layout.mask] = mask
        positions = np.arange(cached, cached + n)[None]
        feeds[layout.positions] = positions.astype(numpy_dtype(inputs[layout.positions].type.dtype))
        for index, array in zip(layout.pasts, past, strict=True):
            feeds[index] = array
        outputs = self.module.run(feeds)
        news = [outputs[index][:, :, capacity:] for index in layout.presents]
        return outputs[layout.logits][0], news

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """`max_new_tokens` new token ids after `prompt_ids`, greedily."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise HexirError("generate needs a prompt of at least one token")
        vocab = self.vocab
        bad = sorted({t for t in prompt if not 0 <= t < vocab})
        if bad:
            raise HexirError(f"token ids {bad[:8]} are outside the vocabulary 0..{vocab - 1}")
        if max_new_tokens < 1:
            raise HexirError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        cache, cached, tokens = self._empty(0), 0, prompt
        new: list[int] = []
        while True:
            logits, news = self.step(cache, cached, tokens)
            cache = self._stored(cache, cached, news)
            cached += len(tokens)
            new.append(int(np.argmax(logits[-1])))
            if len(new) == max_new_tokens:
                return new
            tokens = new[-1:]

    def _empty(self, cached: int) -> list[np.ndarray]:
        """Zeroed past arrays of the capacity for `cached` tokens (the padding's keys and
        values are masked, but stay finite)."""
        shape = (1, self.layout.heads, self.capacity(cached), self.layout.head_dim)
        dtypes = [self.graph.inputs[i].type.dtype for i in self.layout.pasts]
        return [np.zeros(shape, numpy_dtype(dtype)) for dtype in dtypes]

    def _stored(
        self, cache: list[np.ndarray], cached: int, news: list[np.ndarray]
    ) -> list[np.ndarray]:
        """`cache` with `news` written after its `cached` valid tokens: the same arrays where
        their bucket has room, else arrays of the next one, the valid tokens copied over."""
        total = cached + news[0].shape[2]
        if cache[0].shape[2] != self.capacity(total):
            grown = self._empty(total)
            for array, old in zip(grown, cache, strict=True):
                array[:, :, :cached] = old[:, :, :cached]
            cache = grown
        for array, keys in zip(cache, news, strict=True):
            array[:, :, cached:total] = keys
        return cache


def _stem(path: str | os.PathLike[str]) -> str:
    return os.path.splitext(os.path.basename(os.fspath(path)))[0]


def _batch_dim(proto) -> str | None:
    """The dim_param of input_ids' first axis (the batch), None where it is a number."""
    (info,) = [v for v in proto.graph.input if v.name == "input_ids"]
    dims = info.type.tensor_type.shape.dim
    return (dims[0].dim_param or None) if dims else None


def _layout(proto, source: str) -> _Layout:
    """The positions of the decoder's tensors; ModelError naming what is missing."""
    weights = {t.name for t in proto.graph.initializer}
    inputs = [v.name for v in proto.graph.input if v.name not in weights]
    outputs = [v.name for v in proto.graph.output]
    missing = [n for n in ("input_ids", "attention_mask", "position_ids") if n not in inputs]
    pasts = [n for n in inputs if _PAST.fullmatch(n)]
    presents = [n.replace("past_key_values", "present") for n in pasts]
    missing += [n for n in presents if n not in outputs]
    if not pasts:
        missing.append("past_key_values.<layer>.key/value")
    if "logits" not in outputs:
        missing.append("logits")
    if missing:
        raise ModelError(
            f"{source} is not a decoder with past key/values as this generation loop runs it: "
            f"it lacks {', '.join(missing)} (attention_mask and position_ids must be inputs: "
            "the past is padded, masked, and the positions given)"
        )
    info = next(v for v in proto.graph.input if v.name == pasts[0])
    dims = [d.dim_value or None for d in info.type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[1] is None or dims[3] is None:
        raise ModelError(
            f"{source}: {pasts[0]} is not [batch, heads, past, head_dim] with numbers for heads "
            "and head_dim"
        )
    return _Layout(
        inputs.index("input_ids"), inputs.index("attention_mask"), inputs.index("position_ids"),
        tuple(inputs.index(n) for n in pasts), outputs.index("logits"),
        tuple(outputs.index(n) for n in presents), dims[1], dims[3],
    )  # fmt: skip
