"""The model zoo: real layer shapes with seeded random weights, built with GraphBuilder.

- `mlp`: `x` [64, 784] -> `probs` [64, 10]; 784→256→256→10, dense+bias+relu, then the
  classifier's dense+bias and a softmax (probabilities, so the model ends in a reduction).
- `resnet18`, `resnet50`: `image` [1, 3, 224, 224] -> `logits` [1, 1000].
- `mobilenet-v2`: `image` [1, 3, 224, 224] -> `logits` [1, 1000]; depthwise separable
  inverted residuals with relu6.
- `bert-base`: `hidden` [128, 768] -> `out` [128, 768]; one encoder layer.
- `vit`: `hidden` [197, 768] -> `out` [197, 768]; one ViT-B/16 encoder layer (pre-norm).
- `gpt2`: `hidden` [128, 768] -> `out` [128, 768], `present_key`, `present_value`
  [12, 128, 64]; one block over a 128-token prompt.
- `gpt2-decode`: `hidden` [1, 768], `past_key`, `past_value` [12, 127, 64] -> `out` [1, 768],
  `present_key`, `present_value` [12, 128, 64]; the same block for one new token.
- `gpt2-small`: `input_ids` [128] int64 -> `logits` [128, 50257], `present.<l>.key`,
  `present.<l>.value` [12, 128, 64] for l = 0..11; the whole GPT-2 small (124M parameters:
  token and position embeddings, 12 blocks, the final norm, logits by the token embedding).
- `gpt2-small-decode`: `input_ids` [1], `past.<l>.key`, `past.<l>.value` [12, 127, 64] ->
  `logits` [1, 50257] and the presents [12, 128, 64]; the same model for one new token.

The builders take keyword arguments for smaller variants with the same structure, for tests:
`mlp(batch=4, sizes=(32, 16, 8))`, `resnet(18, image=32, width=8, classes=10)`,
`mobilenet_v2(image=32, width=0.25, classes=10)`,
`bert(seq=8, hidden=32, heads=2, ffn=64)`, `vit(seq=9, hidden=32, heads=2, ffn=64)`,
`gpt2(seq=8, hidden=32, heads=2)`,
`gpt2_decode(past=7, hidden=32, heads=2)`,
`gpt2_small(seq=8, layers=2, hidden=32, heads=2, vocab=100)`,
`gpt2_small_decode(past=7, layers=2, hidden=32, heads=2, vocab=100)`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

from hexir.frontend.weights import Weights
from hexir.frontend.zoo_cnn import mobilenet_v2, resnet
from hexir.frontend.zoo_transformer import (
    bert,
    gpt2,
    gpt2_decode,
    gpt2_small,
    gpt2_small_decode,
    vit,
)
from hexir.ir.graph import Graph
from hexir.ops.builder import GraphBuilder

__all__ = [
    "ZOO",
    "zoo_model",
    "mlp",
    "resnet",
    "mobilenet_v2",
    "bert",
    "vit",
    "gpt2",
    "gpt2_decode",
    "gpt2_small",
    "gpt2_small_decode",
]


def mlp(*, batch: int = 64, sizes: Sequence[int] = (784, 256, 256, 10), seed: int = 0) -> Graph:
    """A multilayer perceptron: dense+bias+relu between `sizes`, then a classifier layer and a
    softmax, so the output `probs` is a distribution over the classes."""
    b = GraphBuilder("mlp")
    w = Weights(b, seed)
    x = b.input("x", (batch, sizes[0]))
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        weight, bias = w.dense(f"fc{i + 1}", n_in, n_out)
        x = b.bias_add(b.dense(x, weight), bias)
        if i < len(sizes) - 2:
            x = b.relu(x)
    return b.build(b.softmax(x, axis=1, name="probs"))


# The zoo: each name and the model it builds. A table of data, not a registry: the names are
# what users type (`hexir.load_model("resnet18")`, `hexir show resnet18`).
ZOO: dict[str, Callable[[], Graph]] = {
    "mlp": mlp,
    "resnet18": functools.partial(resnet, 18),
    "resnet50": functools.partial(resnet, 50),
    "mobilenet-v2": mobilenet_v2,
    "bert-base": bert,
    "vit": vit,
    "gpt2": gpt2,
    "gpt2-decode": gpt2_decode,
    "gpt2-small": gpt2_small,
    "gpt2-small-decode": gpt2_small_decode,
}


@functools.lru_cache(maxsize=len(ZOO))
def zoo_model(name: str) -> Graph:
    """The zoo model `name` (built once per process; graphs are immutable)."""
    return ZOO[name]()
