"""GPT-2 in plain float64 numpy, with a key/value cache: the reference `hexir generate`'s
token ids are checked against (benchmarks/decode_cpu.py at GPT-2 small, the tests at a small
size against a version that recomputes the whole sequence at every step).

    weights = gpt2_weights(layers=12, hidden=768, heads=12, vocab=50257, seed=0)
    ids = numpy_greedy([464, 2068], 64, weights, heads=12)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hexir.frontend.zoo_transformer import gpt2_small_paged_decode

__all__ = ["gpt2_weights", "numpy_greedy"]


def gpt2_weights(**size: int) -> dict[str, np.ndarray]:
    """The zoo's GPT-2 weights of this size (`layers`, `hidden`, `heads`, `vocab`, `seed`),
    float64, by name ("wte", "wpe" for every position, "h.<l>.attn.c_attn.weight", ...)."""
    graph = gpt2_small_paged_decode(batch=1, pages=1, max_pages=1, **size)
    return {name: data.array.astype(np.float64) for name, data in graph.constants}


def _norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * gamma + beta


def numpy_greedy(
    prompt: Sequence[int], new: int, w: dict[str, np.ndarray], heads: int
) -> list[int]:
    """`new` token ids after `prompt`, greedily (ties to the lowest id)."""
    hidden = w["wte"].shape[1]
    d = hidden // heads
    layers = sum(1 for name in w if name.endswith("attn.c_attn.weight"))
    keys: list[list[np.ndarray]] = [[] for _ in range(layers)]
    values: list[list[np.ndarray]] = [[] for _ in range(layers)]
    ids, out = list(prompt), []
    fed = 0
    while len(out) < new:
        tokens = ids[fed:]
        x = w["wte"][tokens] + w["wpe"][fed : fed + len(tokens)]
        n, start = len(tokens), fed
        for layer in range(layers):
            p = f"h.{layer}."
            h = _norm(x, w[p + "ln_1.gamma"], w[p + "ln_1.beta"])
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (qkv[:, i * hidden : (i + 1) * hidden].reshape(n, heads, d) for i in range(3))
            keys[layer].append(k)
            values[layer].append(v)
            kk, vv = np.concatenate(keys[layer]), np.concatenate(values[layer])
            scores = np.einsum("shd,thd->hst", q, kk) / math.sqrt(d)
            seen = np.arange(kk.shape[0])[None, :] <= start + np.arange(n)[:, None]
            scores = np.where(seen, scores, -np.inf)
            e = np.exp(scores - scores.max(-1, keepdims=True))
            context = np.einsum("hst,thd->shd", e / e.sum(-1, keepdims=True), vv)
            x = x + context.reshape(n, hidden) @ w[p + "attn.c_proj.weight"]
            x = x + w[p + "attn.c_proj.bias"]
            h = _norm(x, w[p + "ln_2.gamma"], w[p + "ln_2.beta"])
            f = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
            f = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f**3)))
            x = x + f @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        logits = _norm(x[-1], w["ln_f.gamma"], w["ln_f.beta"]) @ w["wte"].T
        fed = len(ids)
        ids.append(int(np.argmax(logits)))
        out.append(ids[-1])
    return out
