"""Greedy generation with GPT-2 (the zoo's weights), its keys and values in a paged KV cache.

    result = hexir.generate([[464, 2068, 7586], [40, 1101]], max_new_tokens=32)
    result.tokens           # the new token ids of each prompt
    result.prefill_seconds, result.decode_seconds, result.pages_in_use

Each prompt is prefilled on its own by the zoo's `gpt2_small` of a symbolic length, compiled
once into a SymbolicModule (hexir/runtime/symbolic_module.py): the graph is prefix-closed in
its length (attention is causal), so a prompt runs padded after its end to its bucket of
lengths (hexir/graph/buckets.py: the next power of two up to 128 tokens, then the next
multiple of 128; a module per bucket, compiled on first use) and its results are cut back.
Its presents fill that sequence's pages, and the logits of its last token give its first new
token. Then every sequence decodes together, one
token each per step, through one `gpt2_small_paged_decode` module for the batch: each layer's
`paged_attention` reads each sequence's cached keys and values through its row of the block
table, plus the token's own, and the step's new keys and values are appended to the cache
after it. That module serves every cache length of its bucket (a block table of a multiple
of PAGE_BUCKET pages, sized by the longest sequence at the end). The decode loop is a VM
program (hexir/runtime/vm.py, `decode_program`), run in one call for all the new tokens: a
Loop whose body reads the cache's lengths and block table, runs the decode module, appends
its keys and values to the cache (builtins over the PagedKVCache, given as an input) and
takes each sequence's argmax, the token it feeds back.
Ties in the argmax go to the lowest token id, as numpy's argmax does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hexir.errors import HexirError
from hexir.frontend.zoo_transformer import POSITIONS, gpt2_small, gpt2_small_paged_decode
from hexir.graph.buckets import bucket
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph
from hexir.runtime.kv_cache import PAGE_SIZE, PagedKVCache
from hexir.runtime.symbolic_module import SymbolicModule
from hexir.runtime.target import Target
from hexir.runtime.vm import Call, CompiledProgram, Loop, Program, Run, sample

__all__ = ["GenerateResult", "Generator", "Sampling", "decode_program", "generate"]

# A decode module's block table holds a multiple of this many pages (128 tokens at the
# default page size): attention then reads about the pages in use, and one module serves
# every length of its bucket.
PAGE_BUCKET = 8


@dataclass(frozen=True)
class Sampling:
    """Draw each new token from softmax(logits / temperature) over the `top_k` likeliest
    (0: all), reproducibly for a seed (the VM's `sample` builtin), instead of the argmax."""

    seed: int = 0
    temperature: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise HexirError(f"sampling temperature must be above 0, got {self.temperature}")
        if self.top_k < 0:
            raise HexirError(f"sampling top_k must be 0 (all tokens) or more, got {self.top_k}")


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
        self._prefill: SymbolicModule | None = None  # made on the first prefill
        self._decode: dict[tuple[int, int, int], object] = {}
        self._loops: dict[tuple, CompiledProgram] = {}

    def _compile(self, graph):
        """`graph` compiled and warmed (`_warm`)."""
        from hexir.runtime.executor import compile

        return _warm(compile(graph, self.target, self.database))  # type: ignore[arg-type]

    @property
    def prefill(self) -> SymbolicModule:
        """GPT-2 over a prompt of any length (its graph and weights made on first use)."""
        if self._prefill is None:
            graph = gpt2_small(seq="seq", **self.size)  # type: ignore[arg-type]
            self._prefill = SymbolicModule(graph, self.target, self.database)
        return self._prefill

    def prefill_module(self, tokens: int):
        """The prefill module that runs a prompt of `tokens` tokens: its bucket's, compiled
        and run once on first use."""
        length = bucket(tokens)
        fresh = (("seq", length),) not in self.prefill.specializations
        module = self.prefill.specialized({"seq": length})
        return _warm(module) if fresh else module

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

    def decode_loop(
        self, batch: int, pages: int, width: int, sampling: Sampling | None = None
    ) -> CompiledProgram:
        """The decode loop (`decode_program`) over `decode_module(batch, pages, width)`."""
        key = (batch, pages, width, sampling)
        if key not in self._loops:
            module = self.decode_module(batch, pages, width)
            layers = self.size["layers"]
            program = decode_program(module.graph, layers, width, sampling)  # type: ignore[attr-defined]
            self._loops[key] = CompiledProgram.of_modules(program, self.target, [module])
        return self._loops[key]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: Sampling | None = None,
    ) -> GenerateResult:
        """`max_new_tokens` new token ids for each prompt, all decoded together: greedily, or
        drawn as `sampling` says."""
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
            self.prefill_module(len(prompt))
        width = self.table_pages(longest)
        loop = self.decode_loop(len(prompts), pages, width, sampling)
        compile_seconds = time.perf_counter() - start
        seqs, last = [], []
        start = time.perf_counter()
        for prompt in prompts:
            logits, *presents = self.prefill.run([np.array(prompt, np.int64)])
            seq = cache.add()
            cache.extend(seq, np.stack(presents[0::2]), np.stack(presents[1::2]))
            seqs.append(seq)
            last.append(logits[-1])
        firsts = np.argmax(last, axis=-1) if sampling is None else sample(
            np.stack(last), 0, **vars(sampling)
        )  # fmt: skip
        tokens = [[int(t)] for t in firsts]
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        steps = max_new_tokens - 1
        in_use: list[int] = []
        if steps:
            feeds = {
                "cache": cache,
                "seqs": np.array(seqs, np.int64),
                "steps": np.array(steps),
                "first": np.array([t[0] for t in tokens], np.int64),
            }
            ids, pages = loop.run(feeds)
            for row, new in enumerate(ids.T):
                tokens[row] += [int(t) for t in new]
            in_use = [int(p) for p in pages]
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


def decode_program(
    graph: Graph, layers: int, width: int, sampling: Sampling | None = None
) -> Program:
    """The decode loop as a VM program over a decode step's graph (`gpt2_small_paged_decode`,
    of `layers` layers and a block table `width` pages wide). Inputs: `cache` (a
    PagedKVCache holding the sequences), `seqs` (their ids), `first` (each one's last token,
    int64) and `steps`; outputs: the new token ids [steps, sequences] and the pages in use
    after each step. Each next token is the argmax, or with `sampling` a draw (the VM's
    `sample` builtin at step i + 1: the first token's draw is step 0)."""
    pools = tuple(f"{kind}{layer}" for layer in range(layers) for kind in ("k", "v"))
    news = tuple(f"new_{name}" for name in pools)
    body = Program(
        ("i", "going", "tokens"),
        (
            Call("kv_lengths", ("cache", "seqs"), ("lengths",)),
            Call("kv_table", ("cache", "seqs"), ("table",), (("width", width),)),
            Call("cast", ("lengths",), ("positions",), (("dtype", "int64"),)),
            Run(graph, ("tokens", "positions", "table", "lengths", *pools), ("logits", *news)),
            Call("kv_append", ("cache", "seqs", *news)),
            _pick(sampling),
            Call("kv_pages_in_use", ("cache",), ("pages",)),
        ),
        ("going", "next", "next", "pages"),
        "decode_step",
    )
    return Program(
        ("cache", "seqs", "first", "steps"),
        (
            Call("kv_pools", ("cache",), pools),
            Loop("steps", None, ("first",), body, ("last", "ids", "pages")),
        ),
        ("ids", "pages"),
        "decode",
    )


def _warm(module):  # Module -> Module
    """`module` after one run on zeros (its buffers allocated, its weights paged in: the first
    run's costs, which the times of `generate` then leave out)."""
    inputs = module.graph.inputs
    module.run([np.zeros(v.type.shape, numpy_dtype(v.type.dtype)) for v in inputs])
    return module


def _pick(sampling: Sampling | None) -> Call:
    """The step that takes the next tokens from the logits: the argmax, or a draw."""
    if sampling is None:
        return Call("argmax", ("logits",), ("next",))
    attrs = tuple(sorted({**vars(sampling), "offset": 1}.items()))
    return Call("sample", ("logits", "i"), ("next",), attrs)


def generate(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: Sampling | None = None,
    **size: object,
) -> GenerateResult:
    """`Generator(**size).generate(prompts, max_new_tokens, sampling)`: GPT-2 small by
    default."""
    return Generator(**size).generate(prompts, max_new_tokens, sampling)  # type: ignore[arg-type]
