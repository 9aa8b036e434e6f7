"""Greedy generation with GPT-2 (the zoo's weights), its keys and values in a paged KV cache.

    result = hexir.generate([[464, 2068, 7586], [40, 1101]], max_new_tokens=32)
    result.tokens           # the new token ids of each prompt
    result.prefill_seconds, result.decode_seconds, result.pages_in_use

Each prompt is prefilled on its own by the zoo's `gpt2_small` at a bucket of lengths (the
next power of two up to 128 tokens, then the next multiple of 128: a module per bucket,
compiled on first use), the prompt padded after its end: attention is causal, so the
prompt's own rows do not see the padding. Its presents fill that sequence's pages, and the
logits of its last token give its first new token. Then every sequence decodes together, one
token each per step, through one `gpt2_small_paged_decode` module for the batch: each layer's
`paged_attention` reads each sequence's cached keys and values through its row of the block
table, plus the token's own, and the step's new keys and values are appended to the cache
after it. That module serves every cache length of its bucket (a block table of a multiple
of PAGE_BUCKET pages, sized by the longest sequence at the end); one Python call runs each
step (the generation loop inside the module's program is issue 16's next step).
Ties in the argmax go to the lowest token id, as numpy's argmax does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hexir.errors import HexirError
from hexir.frontend.zoo_transformer import POSITIONS, gpt2_small, gpt2_small_paged_decode
from hexir.ir.dtype import numpy_dtype
from hexir.runtime.kv_cache import PAGE_SIZE, PagedKVCache
from hexir.runtime.target import Target

__all__ = ["GenerateResult", "Generator", "generate"]

# A decode module's block table holds a multiple of this many pages (128 tokens at the
# default page size): attention then reads about the pages in use, and one module serves
# every length of its bucket.
PAGE_BUCKET = 8


@dataclass
class GenerateResult:
    """The new token ids of each prompt, the seconds spent prefilling (all prompts) and
    decoding, the KV pages in use after each decode step, and the seconds spent compiling
    (or fetching from the build cache) the modules before them."""

    tokens: list[list[int]]
    prefill_seconds: float
    decode_seconds: float
    pages_in_use: list[int] = field(default_factory=list)
    compile_seconds: float = 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        steps = len(self.pages_in_use)
        return steps * len(self.tokens) / self.decode_seconds if self.decode_seconds else 0.0


class Generator:
    """GPT-2 of the given size (the zoo's seeded weights) compiled for generation: prefill
    modules per prompt length and decode modules per batch size, each compiled once."""

    def __init__(
        self,
        *,
        layers: int = 12,
        hidden: int = 768,
        heads: int = 12,
        vocab: int = 50257,
        seed: int = 0,
        page_size: int = PAGE_SIZE,
        max_tokens: int = POSITIONS,
        target: Target | str = "cpu",
        database: object = None,
    ):
        if hidden % heads:
            raise HexirError(f"hidden {hidden} is not a multiple of heads {heads}")
        if not 1 <= max_tokens <= POSITIONS:
            raise HexirError(f"max_tokens {max_tokens} outside GPT-2's 1..{POSITIONS} positions")
        self.size = dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, seed=seed)
        self.page_size = page_size
        self.max_pages = -(-max_tokens // page_size)
        self.max_tokens = max_tokens
        self.target, self.database = Target.of(target), database
        self._prefill: dict[int, object] = {}
        self._decode: dict[tuple[int, int], object] = {}

    def _compile(self, graph):
        """`graph` compiled, then run once on zeros (its buffers allocated, its weights paged
        in: the first run's costs, which the times of `generate` then leave out)."""
        from hexir.runtime.executor import compile

        module = compile(graph, self.target, self.database)  # type: ignore[arg-type]
        module.run([np.zeros(v.type.shape, numpy_dtype(v.type.dtype)) for v in graph.inputs])
        return module

    def prefill_length(self, tokens: int) -> int:
        """The length of the prefill module that runs a prompt of `tokens` tokens."""
        bucket = 1 << (tokens - 1).bit_length() if tokens <= 128 else -(-tokens // 128) * 128
        return min(bucket, self.max_tokens)

    def prefill_module(self, length: int):
        """The prefill module of a bucket's length (`prefill_length`)."""
        if length not in self._prefill:
            self._prefill[length] = self._compile(gpt2_small(seq=length, **self.size))
        return self._prefill[length]

    def table_pages(self, tokens: int) -> int:
        """The block table's width for sequences of up to `tokens` tokens: their pages rounded
        up to a multiple of PAGE_BUCKET (so attention reads about the pages in use, and a
        decode module serves a bucket of lengths), at most `max_tokens`' pages."""
        pages = -(-tokens // self.page_size)
        return min(self.max_pages, -(-pages // PAGE_BUCKET) * PAGE_BUCKET)

    def decode_module(self, batch: int, pages: int, table_pages: int | None = None):
        """The decode step for `batch` sequences over a pool of `pages` pages, whose block
        table has `table_pages` columns (default: the most a sequence may hold)."""
        width = table_pages or self.max_pages
        key = (batch, pages, width)
        if key not in self._decode:
            graph = gpt2_small_paged_decode(
                batch=batch, pages=pages, page_size=self.page_size, max_pages=width,
                **self.size,
            )  # fmt: skip
            self._decode[key] = self._compile(graph)
        return self._decode[key]

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> GenerateResult:
        """`max_new_tokens` new token ids for each prompt, greedily, all decoded together."""
        prompts = [list(map(int, p)) for p in prompts]
        self._check(prompts, max_new_tokens)
        layers, heads = self.size["layers"], self.size["heads"]
        longest = max(len(p) for p in prompts) + max_new_tokens
        # a pool that holds every sequence at the most tokens: the decode module of a batch
        # and a bucket then serves any lengths (pages are taken as tokens come)
        pages = len(prompts) * self.max_pages
        cache = PagedKVCache(
            layers=layers, heads=heads, head_dim=self.size["hidden"] // heads, pages=pages,
            page_size=self.page_size, max_pages=self.max_pages,
        )  # fmt: skip
        start = time.perf_counter()
        for prompt in prompts:  # compiled first, so that the times below are of running
            self.prefill_module(self.prefill_length(len(prompt)))
        width = self.table_pages(longest)
        decode = self.decode_module(len(prompts), pages, width)
        compile_seconds = time.perf_counter() - start
        seqs, tokens = [], []
        start = time.perf_counter()
        for prompt in prompts:
            n, length = len(prompt), self.prefill_length(len(prompt))
            padded = np.zeros(length, np.int64)
            padded[:n] = prompt
            logits, *presents = self.prefill_module(length).run([padded])
            seq = cache.add()
            keys, values = np.stack(presents[0::2]), np.stack(presents[1::2])
            cache.extend(seq, keys[:, :, :n], values[:, :, :n])
            seqs.append(seq)
            tokens.append([int(np.argmax(logits[n - 1]))])
        prefill = time.perf_counter() - start
        in_use: list[int] = []
        start = time.perf_counter()
        for _ in range(max_new_tokens - 1):
            lengths = cache.lengths(seqs)
            feeds = [
                np.array([t[-1] for t in tokens], np.int64),
                lengths.astype(np.int64),  # the new token's position: the tokens before it
                cache.block_table(seqs, width),
                lengths,
            ]
            for layer in range(layers):
                feeds += [cache.keys[layer], cache.values[layer]]
            logits, *news = decode.run(feeds)
            keys, values = np.stack(news[0::2], axis=1), np.stack(news[1::2], axis=1)
            for row, seq in enumerate(seqs):
                cache.append(seq, keys[row], values[row])
                tokens[row].append(int(np.argmax(logits[row])))
            in_use.append(cache.pages_in_use)
        return GenerateResult(tokens, prefill, time.perf_counter() - start, in_use, compile_seconds)

    def _check(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        vocab = self.size["vocab"]
        if not prompts or any(not p for p in prompts):
            raise HexirError("generate needs at least one prompt, each of at least one token")
        bad = sorted({t for p in prompts for t in p if not 0 <= t < vocab})
        if bad:
            raise HexirError(f"token ids {bad[:8]} are outside the vocabulary 0..{vocab - 1}")
        if max_new_tokens < 1:
            raise HexirError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        longest = max(len(p) for p in prompts) + max_new_tokens
        if longest > self.max_tokens:
            raise HexirError(
                f"a prompt of {longest - max_new_tokens} tokens and {max_new_tokens} new ones "
                f"make {longest}, past the {self.max_tokens} positions this generator holds"
            )


def generate(
    prompts: Sequence[Sequence[int]], max_new_tokens: int, **size: object
) -> GenerateResult:
    """`Generator(**size).generate(prompts, max_new_tokens)`: GPT-2 small by default."""
    return Generator(**size).generate(prompts, max_new_tokens)  # type: ignore[arg-type]
