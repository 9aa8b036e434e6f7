"""A paged KV cache: every layer's keys and values in pages of `page_size` tokens, taken from
one pool on demand, each sequence's pages listed in order in its row of a block table; the
`paged_attention` op (hexir/ops/attention.py) reads a sequence's keys through that row.

    cache = PagedKVCache(layers=12, heads=12, head_dim=64, pages=256, page_size=16)
    seq = cache.add()                       # a sequence with no tokens
    cache.extend(seq, keys, values)         # [layers, heads, tokens, head_dim] (a prompt's)
    cache.append(seq, key, value)           # [layers, heads, head_dim]: one more token
    cache.block_table([s0, s1])             # int32 [2, max_pages]: their pages, in order
    cache.lengths([s0, s1])                 # int32 [2]: their tokens
    cache.free(seq)                         # its pages back to the pool

`keys[layer]` and `values[layer]` are the pool's pages, [pages, heads, page_size, head_dim],
which a decode step takes as the `k_pages` and `v_pages` of each layer's paged_attention. A
sequence holds ceil(tokens / page_size) pages: a new page when its last is full, so pages in
use grow with the tokens (`pages_in_use`). A table row lists a sequence's pages and then page
0 up to `max_pages` (the op reads past a sequence's length only to mask it). Running out of
pages, or a sequence past `max_pages` pages, is a ResourceError that changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hexir.errors import HexirError, ResourceError
from hexir.ir.dtype import numpy_dtype

__all__ = ["PagedKVCache"]

PAGE_SIZE = 16  # tokens a page, by default


class PagedKVCache:
    def __init__(
        self,
        *,
        layers: int,
        heads: int,
        head_dim: int,
        pages: int,
        page_size: int = PAGE_SIZE,
        max_pages: int | None = None,
        dtype: str = "float32",
    ):
        if min(layers, heads, head_dim, pages, page_size) < 1:
            raise HexirError(
                f"a paged KV cache needs sizes of at least 1: layers={layers}, heads={heads}, "
                f"head_dim={head_dim}, pages={pages}, page_size={page_size}"
            )
        self.page_size = page_size
        self.max_pages = max_pages if max_pages is not None else pages
        shape = (layers, pages, heads, page_size, head_dim)
        self.keys = np.zeros(shape, numpy_dtype(dtype))
        self.values = np.zeros(shape, numpy_dtype(dtype))
        self._free = list(range(pages - 1, -1, -1))  # popped from the end: page 0 first
        self._pages: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next = 0

    # --- sequences ----------------------------------------------------------------------------

    def add(self) -> int:
        """A new sequence, without tokens (and so without pages); its id."""
        seq, self._next = self._next, self._next + 1
        self._pages[seq], self._lengths[seq] = [], 0
        return seq

    def free(self, seq: int) -> None:
        """The sequence ends: its pages go back to the pool."""
        self._free.extend(reversed(self._pages.pop(self._check(seq))))
        del self._lengths[seq]

    def length(self, seq: int) -> int:
        return self._lengths[self._check(seq)]

    @property
    def sequences(self) -> tuple[int, ...]:
        return tuple(self._pages)

    @property
    def pages_in_use(self) -> int:
        return sum(len(p) for p in self._pages.values())

    @property
    def free_pages(self) -> int:
        return len(self._free)

    # --- tokens -------------------------------------------------------------------------------

    def append(self, seq: int, key: np.ndarray, value: np.ndarray) -> None:
        """One more token: its key and value [layers, heads, head_dim]."""
        self.extend(seq, key[:, :, None], value[:, :, None])

    def extend(self, seq: int, keys: np.ndarray, values: np.ndarray) -> None:
        """More tokens: their keys and values [layers, heads, tokens, head_dim], in order."""
        layers, _, heads, s, dim = self.keys.shape
        want = (layers, heads, keys.shape[2], dim)
        if keys.shape != want or values.shape != want:
            raise HexirError(
                f"keys {keys.shape} and values {values.shape} are not [layers, heads, tokens, "
                f"head_dim] = {list(want)}"
            )
        start = self.length(seq)
        end = start + keys.shape[2]
        self._reserve(seq, -(-end // s))
        for page_index in range(start // s, -(-end // s)):
            page = self._pages[seq][page_index]
            lo, hi = max(start, page_index * s), min(end, (page_index + 1) * s)
            slots = slice(lo - page_index * s, hi - page_index * s)
            for pool, given in ((self.keys, keys), (self.values, values)):
                pool[:, page, :, slots] = given[:, :, lo - start : hi - start]
        self._lengths[seq] = end

    def _reserve(self, seq: int, pages: int) -> None:
        held = self._pages[seq]
        more = pages - len(held)
        if pages > self.max_pages:
            raise ResourceError(
                f"sequence {seq} would need {pages} pages of {self.page_size} tokens; a sequence "
                f"holds at most {self.max_pages} (max_pages)"
            )
        if more > len(self._free):
            raise ResourceError(
                f"the KV cache is out of pages: sequence {seq} needs {more} more, "
                f"{len(self._free)} of {self.keys.shape[1]} are free"
            )
        held.extend(self._free.pop() for _ in range(max(more, 0)))

    # --- what a decode step reads -------------------------------------------------------------

    def block_table(self, seqs: Sequence[int], width: int | None = None) -> np.ndarray:
        """int32 [len(seqs), width (default max_pages)]: each sequence's pages in order, then
        page 0; a sequence with more pages than `width` is a ResourceError."""
        width = self.max_pages if width is None else width
        table = np.zeros((len(seqs), width), np.int32)
        for row, seq in enumerate(seqs):
            pages = self._pages[self._check(seq)]
            if len(pages) > width:
                raise ResourceError(
                    f"sequence {seq} holds {len(pages)} pages, more than a table of {width}"
                )
            table[row, : len(pages)] = pages
        return table

    def lengths(self, seqs: Sequence[int]) -> np.ndarray:
        return np.array([self.length(s) for s in seqs], np.int32)

    def _check(self, seq: int) -> int:
        if seq not in self._pages:
            raise HexirError(f"no sequence {seq} in the KV cache (its sequences: {self.sequences})")
        return seq
