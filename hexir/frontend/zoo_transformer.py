"""Transformer blocks: a BERT-base encoder layer, a ViT-B/16 encoder layer and a GPT-2 block
(prefill and decode), and the whole GPT-2 small (token ids to logits, prefill and decode).

Batch 1 throughout, kept implicit: activations are [tokens, hidden]; attention splits heads
with reshape and transpose into [heads, tokens, head_dim] and runs on batch_matmul. Weights
are Xavier-scaled (std 1/sqrt(fan_in)) so activations stay of order one.

The GPT-2 prefill and decode graphs draw the same weights (same seed), so decoding token t
with the keys and values of tokens 0..t-1 from the prefill gives the prefill's row t.
"""

from __future__ import annotations

import math

import numpy as np

from hexir.errors import ModelError
from hexir.frontend.weights import Weights, normal, uniform
from hexir.ir.graph import Graph, Value
from hexir.ir.symbolic import Sym
from hexir.ops.builder import GraphBuilder

# What the causal mask adds above the diagonal: exp underflows to exactly 0 after the
# softmax's max subtraction, without the inf arithmetic a -inf would bring into kernels.
MASKED = -1e9


def bert(
    *, seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, seed: int = 0
) -> Graph:
    """One BERT-base encoder layer (post-LayerNorm, exact GELU): `hidden` [seq, hidden] in,
    `out` [seq, hidden] out."""
    b = GraphBuilder("bert-base")
    w = Weights(b, seed)
    x = b.input("hidden", (seq, hidden))
    q, k, v = (_dense(b, w, f"attention.{n}", x, hidden, hidden) for n in ("query", "key", "value"))
    context = _attention(
        b, _heads(b, q, heads), _heads(b, k, heads, keys=True), _heads(b, v, heads)
    )
    attn = _dense(b, w, "attention.output", context, hidden, hidden)
    h = b.layer_norm(b.add(attn, x), *w.norm("attention.layer_norm", hidden), epsilon=1e-12)
    f = b.gelu(_dense(b, w, "intermediate", h, hidden, ffn))
    out = b.add(_dense(b, w, "output", f, ffn, hidden), h)
    gamma, beta = w.norm("output.layer_norm", hidden)
    return b.build(b.layer_norm(out, gamma, beta, epsilon=1e-12, name="out"))


def vit(
    *, seq: int = 197, hidden: int = 768, heads: int = 12, ffn: int = 3072, seed: int = 0
) -> Graph:
    """One ViT-B/16 encoder layer (pre-LayerNorm, exact GELU) over the 197 tokens of a
    224x224 image (196 patches and the class token): `hidden` [seq, hidden] in, `out`
    [seq, hidden] out. 197 rows divide no register tile: the odd-shape case."""
    b = GraphBuilder("vit")
    w = Weights(b, seed)
    x = b.input("hidden", (seq, hidden))
    n = b.layer_norm(x, *w.norm("layernorm_before", hidden), epsilon=1e-12)
    q, k, v = (_dense(b, w, f"attention.{m}", n, hidden, hidden) for m in ("query", "key", "value"))
    context = _attention(
        b, _heads(b, q, heads), _heads(b, k, heads, keys=True), _heads(b, v, heads)
    )
    h = b.add(_dense(b, w, "attention.output", context, hidden, hidden), x)
    n = b.layer_norm(h, *w.norm("layernorm_after", hidden), epsilon=1e-12)
    f = b.gelu(_dense(b, w, "intermediate", n, hidden, ffn))
    return b.build(b.add(_dense(b, w, "output", f, ffn, hidden), h, name="out"))


def gpt2(*, seq: int = 128, hidden: int = 768, heads: int = 12, seed: int = 0) -> Graph:
    """One GPT-2 block over a prompt of `seq` tokens (pre-LayerNorm, causal mask, tanh GELU):
    `hidden` [seq, hidden] in; `out` [seq, hidden], `present_key` and `present_value`
    [heads, seq, head_dim] (the KV cache a decode step continues from) out."""
    b = GraphBuilder("gpt2")
    p = _GPT2Params(b, hidden, seed)
    x = b.input("hidden", (seq, hidden))
    q, k, v = p.qkv(x)
    key = _heads(b, k, heads, name="present_key")
    value = _heads(b, v, heads, name="present_value")
    mask = np.triu(np.full((seq, seq), MASKED, np.float32), k=1)
    scores_mask = b.constant(mask, name="causal_mask")
    context = _attention(b, _heads(b, q, heads), _keys_t(b, key), value, mask=scores_mask)
    return b.build([p.rest(x, context), key, value])


def gpt2_decode(*, past: int = 127, hidden: int = 768, heads: int = 12, seed: int = 0) -> Graph:
    """The `gpt2` block for one new token after `past` cached ones: `hidden` [1, hidden],
    `past_key` and `past_value` [heads, past, head_dim] in; `out` [1, hidden], `present_key`
    and `present_value` [heads, past + 1, head_dim] out."""
    b = GraphBuilder("gpt2-decode")
    p = _GPT2Params(b, hidden, seed)
    x = b.input("hidden", (1, hidden))
    past_key = b.input("past_key", (heads, past, hidden // heads))
    past_value = b.input("past_value", (heads, past, hidden // heads))
    q, k, v = p.qkv(x)
    key = b.concat([past_key, _heads(b, k, heads)], axis=1, name="present_key")
    value = b.concat([past_value, _heads(b, v, heads)], axis=1, name="present_value")
    context = _attention(b, _heads(b, q, heads), _keys_t(b, key), value)
    return b.build([p.rest(x, context), key, value])


class _GPT2Params:
    """GPT-2's weights in its own layout (Conv1D: weight [in, out], used with `matmul`), all
    drawn up front in one order, so prefill and decode share them."""

    def __init__(self, b: GraphBuilder, hidden: int, seed: int, prefix: str = ""):
        rng = np.random.default_rng(seed)
        std_in, std_ffn = 1.0 / math.sqrt(hidden), 1.0 / math.sqrt(4 * hidden)
        shapes = {
            "attn.c_attn": ((hidden, 3 * hidden), std_in),
            "attn.c_proj": ((hidden, hidden), std_in),
            "mlp.c_fc": ((hidden, 4 * hidden), std_in),
            "mlp.c_proj": ((4 * hidden, hidden), std_ffn),
        }
        self.b, self.hidden, self.prefix = b, hidden, prefix
        self.arrays: dict[str, np.ndarray] = {}
        for name in ("ln_1", "ln_2"):
            self.arrays[f"{name}.gamma"] = uniform(rng, (hidden,), 0.9, 1.1)
            self.arrays[f"{name}.beta"] = normal(rng, (hidden,), 0.02)
        for name, (shape, std) in shapes.items():
            self.arrays[f"{name}.weight"] = normal(rng, shape, std)
            self.arrays[f"{name}.bias"] = normal(rng, shape[1:], 0.02)

    def const(self, name: str) -> Value:
        return self.b.constant(self.arrays[name], name=self.prefix + name)

    def linear(self, name: str, x: Value) -> Value:
        y = self.b.matmul(x, self.const(f"{name}.weight"))
        return self.b.bias_add(y, self.const(f"{name}.bias"))

    def norm(self, name: str, x: Value) -> Value:
        return self.b.layer_norm(x, self.const(f"{name}.gamma"), self.const(f"{name}.beta"))

    def qkv(self, x: Value) -> tuple[Value, Value, Value]:
        """q, k, v [tokens, hidden]: one matmul for all three, then slices."""
        b, h = self.b, self.hidden
        qkv = self.linear("attn.c_attn", self.norm("ln_1", x))
        rows = x.type.shape[0]
        q, k, v = (b.slice(qkv, (0, i * h), (rows, (i + 1) * h)) for i in range(3))
        return q, k, v

    def rest(self, x: Value, context: Value, name: str | None = "out") -> Value:
        """The block after attention: projection, residual, MLP (tanh GELU), residual."""
        b = self.b
        h = b.add(x, self.linear("attn.c_proj", context))
        m = b.gelu(self.linear("mlp.c_fc", self.norm("ln_2", h)), approximate="tanh")
        return b.add(h, self.linear("mlp.c_proj", m), name=name)


# GPT-2 small's positions (its defaults: 12 layers, 768 wide, 12 heads, 50257 tokens: 124M
# parameters).
POSITIONS = 1024


def gpt2_small(
    *, seq: int | str | Sym = 128, layers: int = 12, hidden: int = 768, heads: int = 12,
    vocab: int = 50257, seed: int = 0,
) -> Graph:  # fmt: skip
    """GPT-2 small over a prompt of `seq` tokens (seeded random weights, GPT-2's shapes:
    token and position embeddings, `layers` blocks, a final layer norm, logits by the token
    embedding): `input_ids` [seq] int64 in; `logits` [seq, vocab] and each layer's
    `present.<l>.key` and `present.<l>.value` [heads, seq, head_dim] out. A symbolic `seq`
    (a name, e.g. "seq") gives one graph for every prompt length: positions looked up by an
    `arange` of them, causal `attention` ops in place of the mask's constant."""
    b = GraphBuilder("gpt2-small")
    model = _GPT2Stack(b, layers, hidden, vocab, seed)
    ids = b.input("input_ids", (seq,), "int64")
    seq = ids.type.shape[0]
    mask = None
    if isinstance(seq, int):
        causal = np.triu(np.full((seq, seq), MASKED, np.float32), k=1)
        mask = b.constant(causal, name="causal_mask")
    x, presents = model.embed(ids, 0), []
    for layer, p in enumerate(model.layers):
        q, k, v = p.qkv(x)
        key = _heads(b, k, heads, name=f"present.{layer}.key")
        value = _heads(b, v, heads, name=f"present.{layer}.value")
        keys_t = _keys_t(b, key)
        context = _attention(b, _heads(b, q, heads), keys_t, value, mask=mask, causal=mask is None)
        x = p.rest(x, context, name=None)
        presents += [key, value]
    return b.build([model.head(x), *presents])


def gpt2_small_decode(
    *, past: int = 127, layers: int = 12, hidden: int = 768, heads: int = 12,
    vocab: int = 50257, seed: int = 0,
) -> Graph:  # fmt: skip
    """`gpt2_small` for one new token after `past` cached ones (the same weights): `input_ids`
    [1] int64 and each layer's `past.<l>.key` and `past.<l>.value` [heads, past, head_dim]
    in; `logits` [1, vocab] and each layer's presents [heads, past + 1, head_dim] out."""
    b = GraphBuilder("gpt2-small-decode")
    model = _GPT2Stack(b, layers, hidden, vocab, seed)
    ids = b.input("input_ids", (1,), "int64")
    cached = [
        tuple(
            b.input(f"past.{layer}.{kind}", (heads, past, hidden // heads))
            for kind in ("key", "value")
        )
        for layer in range(layers)
    ]
    x, presents = model.embed(ids, past), []
    for layer, (p, (past_key, past_value)) in enumerate(zip(model.layers, cached, strict=True)):
        q, k, v = p.qkv(x)
        key = b.concat([past_key, _heads(b, k, heads)], axis=1, name=f"present.{layer}.key")
        value = b.concat([past_value, _heads(b, v, heads)], axis=1, name=f"present.{layer}.value")
        context = _attention(b, _heads(b, q, heads), _keys_t(b, key), value)
        x = p.rest(x, context, name=None)
        presents += [key, value]
    return b.build([model.head(x), *presents])


def gpt2_small_paged_decode(
    *, batch: int = 1, pages: int = 64, page_size: int = 16, max_pages: int = 64,
    layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 50257, seed: int = 0,
) -> Graph:  # fmt: skip
    """`gpt2_small` (the same weights) for one new token of each of `batch` sequences whose
    keys and values are cached in pages (hexir/runtime/kv_cache.py): `input_ids` and
    `positions` [batch] int64, `block_table` [batch, max_pages] and `lengths` [batch] int32
    (each sequence's cached tokens), each layer's `pages.<l>.key` and `pages.<l>.value`
    [pages, heads, page_size, head_dim] in; `logits` [batch, vocab] and each layer's
    `new.<l>.key` and `new.<l>.value` [batch, heads, head_dim] (the tokens' own, for the
    cache) out. One module serves every cache length up to max_pages * page_size tokens."""
    b = GraphBuilder("gpt2-small-paged-decode")
    model = _GPT2Stack(b, layers, hidden, vocab, seed)
    head_dim = hidden // heads
    ids = b.input("input_ids", (batch,), "int64")
    positions = b.input("positions", (batch,), "int64")
    table = b.input("block_table", (batch, max_pages), "int32")
    lengths = b.input("lengths", (batch,), "int32")
    cached = [
        tuple(
            b.input(f"pages.{layer}.{kind}", (pages, heads, page_size, head_dim))
            for kind in ("key", "value")
        )
        for layer in range(layers)
    ]
    wpe = b.constant(model.wpe, name="wpe")
    x = b.add(b.op("gather", model.wte, ids, axis=0), b.op("gather", wpe, positions, axis=0))
    news = []
    for layer, (p, (k_pages, v_pages)) in enumerate(zip(model.layers, cached, strict=True)):
        q, k, v = (b.reshape(t, (batch, heads, head_dim)) for t in p.qkv(x))
        key = b.reshape(k, (batch, heads, head_dim), name=f"new.{layer}.key")
        value = b.reshape(v, (batch, heads, head_dim), name=f"new.{layer}.value")
        context = b.paged_attention(q, k_pages, v_pages, table, lengths, key, value)
        x = p.rest(x, b.reshape(context, (batch, hidden)), name=None)
        news += [key, value]
    return b.build([model.head(x), *news])


class _GPT2Stack:
    """GPT-2's whole-model weights, drawn in one order (so prefill and decode share them): the
    token embedding wte [vocab, hidden] (also the logits' weight), the position embedding
    [POSITIONS, hidden], each layer's `_GPT2Params`, the final layer norm."""

    def __init__(self, b: GraphBuilder, layers: int, hidden: int, vocab: int, seed: int):
        rng = np.random.default_rng(seed)
        self.b = b
        # Scaled so the logits of a layer-normed state have a standard deviation near one.
        self.wte = b.constant(normal(rng, (vocab, hidden), 1.0 / math.sqrt(hidden)), name="wte")
        self.wpe = normal(rng, (POSITIONS, hidden), 0.02)
        self.ln_f = (uniform(rng, (hidden,), 0.9, 1.1), normal(rng, (hidden,), 0.02))
        self.layers = [
            _GPT2Params(b, hidden, seed + 1 + layer, prefix=f"h.{layer}.")
            for layer in range(layers)
        ]

    def embed(self, ids: Value, start: int) -> Value:
        """The tokens' embeddings plus those of positions start, start + 1, ..."""
        tokens = self.b.op("gather", self.wte, ids, axis=0)
        n = ids.type.shape[0]
        if isinstance(n, Sym):  # any length: the positions looked up as the tokens are
            wpe = self.b.constant(self.wpe, name="wpe")
            where = self.b.op("arange", start=start, stop=start + n, step=1, dtype="int64")
            return self.b.add(tokens, self.b.op("gather", wpe, where, axis=0))
        if start + n > POSITIONS:
            raise ModelError(
                f"GPT-2 has {POSITIONS} positions: tokens {start}..{start + n - 1} do not fit "
                f"(a prompt and its cache hold at most {POSITIONS} tokens)"
            )
        return self.b.add(tokens, self.b.constant(self.wpe[start : start + n], name="wpe"))

    def head(self, x: Value) -> Value:
        gamma, beta = (
            self.b.constant(a, name=n)
            for a, n in zip(self.ln_f, ("ln_f.gamma", "ln_f.beta"), strict=True)
        )
        return self.b.dense(self.b.layer_norm(x, gamma, beta), self.wte, name="logits")


def _dense(b: GraphBuilder, w: Weights, name: str, x: Value, n_in: int, n_out: int) -> Value:
    weight, bias = w.dense(name, n_in, n_out)
    return b.bias_add(b.dense(x, weight), bias)


def _heads(
    b: GraphBuilder, x: Value, heads: int, *, keys: bool = False, name: str | None = None
) -> Value:
    """[tokens, hidden] -> [heads, tokens, head_dim], or [heads, head_dim, tokens] for keys."""
    tokens, hidden = x.type.shape
    split = b.reshape(x, (tokens, heads, hidden // heads))
    return b.transpose(split, (1, 2, 0) if keys else (1, 0, 2), name=name)


def _keys_t(b: GraphBuilder, key: Value) -> Value:
    return b.transpose(key, (0, 2, 1))


def _attention(
    b: GraphBuilder,
    q: Value,
    keys_t: Value,
    v: Value,
    mask: Value | None = None,
    causal: bool = False,
) -> Value:
    """softmax(q·kᵀ/sqrt(d) + mask)·v per head, heads merged back: [tokens, hidden]; with
    `causal`, one `attention` op that hides each query's later keys."""
    heads, tokens, head_dim = q.type.shape
    if causal:
        context = b.op("attention", q, keys_t, v, scale=1.0 / math.sqrt(head_dim), causal=True)
        return b.reshape(b.transpose(context, (1, 0, 2)), (tokens, heads * head_dim))
    scale = b.constant(np.array(1.0 / math.sqrt(head_dim), np.float32))
    scores = b.mul(b.batch_matmul(q, keys_t), scale)
    if mask is not None:
        scores = b.add(scores, mask)
    context = b.batch_matmul(b.softmax(scores, axis=2), v)
    merged = b.transpose(context, (1, 0, 2))
    return b.reshape(merged, (tokens, heads * head_dim))
