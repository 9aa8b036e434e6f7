"""Memory planning: where every intermediate of a command list lives.

    steps = [Step(reads=("x",), writes=("0",)),
             Step(reads=("0",), writes=("1",), inplace=(("1", "0"),)), ...]
    plan = plan_memory(steps, sizes={"0": 4096, "1": 4096, ...})
    plan.placement("1")       # Placement(storage=0, offset=0, nbytes=4096)
    print(plan.summary())

The command list is static: step t runs one kernel that reads some values and writes others.
Only the values named in `sizes` are planned (the intermediates); graph inputs, outputs and
constants live elsewhere and are ignored. A value is live from the step that writes it to the
last step that reads it, both included, so a kernel's inputs and outputs never share memory
unless the plan runs it in place.

In place. An output takes over the memory of an input when the step allows it (an elementwise
kernel: `Step.inplace` names the pair), the input dies at that step and the two have the same
size. The values that share memory this way form one buffer, live from the first one's step to
the last one's last reader.

Placement. Buffers are placed twice, and the plan keeps the smaller peak (the pool on a tie):

- `pool`: a storage pool walked in step order. A buffer's memory returns to the pool after its
  last reader and merges with the free chunks beside it. A buffer takes (1) a whole free chunk
  of its size class (the slack, under 25%, stays with it, so no sliver fragments the storage),
  else (2) the front of the smallest larger free chunk, the rest staying free, else (3) the
  free chunk at the end of a storage, the largest such, with the storage grown to fit, else
  (4) a new storage.
- `best-fit`: one arena; since the command list is static every lifetime is known up front,
  so buffers are placed largest first, each in the smallest gap left by the buffers already
  placed whose lifetimes overlap its own (or above them all).

The pool needs nothing but the past and suits chains; the best-fit arena packs tighter where
large and small buffers alternate (attention blocks). On the zoo both reach the bound or come
close; neither is best on every model.

Views. A view (a reshape that no kernel computes) is another name for a value's memory:
`aliases` maps it to that value (the root of a chain of views). A step reading the view reads
the value, so the value lives to the last use of either name, and an in-place step may take
its memory only when that is the last use of every name (and the step reads it under one
name only: a kernel reading one storage under two shapes may read an element it already
overwrote). The view is placed where its value is.

Sizes are rounded up to `ALIGN` (64) bytes: one cache line, and the alignment of a 512-bit
vector, so every value starts aligned. Size classes are quarter steps between powers of two
(…, 1024, 1280, 1536, 1792, 2048, 2560, …).

Figures: `peak_bytes` is the sum of the storages (all allocated for the whole run);
`total_bytes` the sum of all intermediates (one buffer each, no reuse); `lower_bound` the
largest number of bytes live at one step. Running in place can bring the peak under it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hexir.ir.arrays import ALIGN

__all__ = ["ALIGN", "MemoryPlan", "Placement", "Step", "plan_memory", "size_class"]


@dataclass(frozen=True)
class Step:
    """One kernel call: the values it reads and writes, and the (output, input) pairs that
    may share memory because the kernel computes each output element from the same element
    of that input alone."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]
    inplace: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Placement:
    """Where a value lives: `nbytes` bytes at `offset` in storage `storage`."""

    storage: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class MemoryPlan:
    """Per planned value its placement; the storages' sizes; the figures of the module doc."""

    placements: tuple[tuple[str, Placement], ...]
    storage_sizes: tuple[int, ...]
    total_bytes: int
    lower_bound: int
    inplace: tuple[tuple[str, str], ...] = ()  # (value, the dying input whose memory it took)
    strategy: str = "pool"  # "pool" | "best-fit"
    views: tuple[tuple[str, str], ...] = ()  # (view, the planned value whose memory it is)

    @property
    def peak_bytes(self) -> int:
        """Bytes of intermediate memory the plan allocates: the sum of its storages."""
        return sum(self.storage_sizes)

    def placement(self, name: str) -> Placement:
        """Where value `name` lives (KeyError if the plan does not place it)."""
        for key, placement in self.placements:
            if key == name:
                return placement
        raise KeyError(f"the memory plan does not place %{name}")

    def as_dict(self) -> dict[str, Placement]:
        return dict(self.placements)

    def summary(self) -> str:
        """The figures, one per line, for people (`hexir show MODEL --memory`)."""
        ratio = self.peak_bytes / self.lower_bound if self.lower_bound else 1.0
        return "\n".join(
            [
                f"memory plan ({self.strategy}): {len(self.placements) - len(self.views)} "
                f"intermediates in {len(self.storage_sizes)} storages, {len(self.inplace)} in "
                f"place, {len(self.views)} views",
                f"  planned peak          {_mib(self.peak_bytes)}",
                f"  liveness lower bound  {_mib(self.lower_bound)}   (peak / bound {ratio:.2f})",
                f"  sum of intermediates  {_mib(self.total_bytes)}",
            ]
        )

    def to_json(self) -> str:
        """The plan as JSON text (artifacts keep it; `from_json` reads it back)."""
        return json.dumps(
            {
                "placements": [[n, p.storage, p.offset, p.nbytes] for n, p in self.placements],
                "storage_sizes": list(self.storage_sizes),
                "total_bytes": self.total_bytes,
                "lower_bound": self.lower_bound,
                "inplace": [list(pair) for pair in self.inplace],
                "strategy": self.strategy,
                "views": [list(pair) for pair in self.views],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> MemoryPlan:
        data = json.loads(text)
        return cls(
            tuple((str(n), Placement(int(s), int(o), int(b))) for n, s, o, b in data["placements"]),
            tuple(int(s) for s in data["storage_sizes"]),
            int(data["total_bytes"]),
            int(data["lower_bound"]),
            tuple((str(a), str(b)) for a, b in data["inplace"]),
            str(data["strategy"]),
            tuple((str(a), str(b)) for a, b in data["views"]),
        )


def size_class(nbytes: int) -> int:
    """The class of a size: itself rounded up to a quarter step between powers of two."""
    n = align(nbytes)
    if n <= 4 * ALIGN:
        return n
    quarter = 1 << (n.bit_length() - 3)  # a quarter of the power of two at or below n
    return -(-n // quarter) * quarter


def align(nbytes: int) -> int:
    """`nbytes` rounded up to a multiple of `ALIGN` (at least one)."""
    return max(-(-nbytes // ALIGN), 1) * ALIGN


def plan_memory(
    steps: Sequence[Step], sizes: Mapping[str, int], aliases: Mapping[str, str] | None = None
) -> MemoryPlan:
    """Place every value of `sizes` (its byte size) for the command list `steps`, and every
    view of `aliases` (view -> the value whose memory it is) where its value is."""
    aliases = aliases or {}
    steps = [_through_views(step, aliases) for step in steps]
    first, last = _liveness(steps, sizes)
    missing = sorted(set(sizes) - set(first))
    if missing:
        raise ValueError(f"values no step writes: {', '.join(missing)}")
    owner, inplace = _share_in_place(steps, sizes, last)
    buffers = _buffers(owner, first, last, sizes)
    candidates = [("pool", _pool_place(buffers)), ("best-fit", _best_fit_place(buffers))]
    strategy, (where, storages) = min(candidates, key=lambda c: sum(c[1][1]))
    placed = {
        v: Placement(where[owner[v]].storage, where[owner[v]].offset, sizes[v]) for v in first
    }
    views = tuple((view, root) for view, root in aliases.items() if root in placed)
    placements = (*placed.items(), *((view, placed[root]) for view, root in views))
    lower = _lower_bound(first, last, sizes, len(steps))
    return MemoryPlan(
        placements, tuple(storages), sum(sizes.values()), lower, tuple(inplace), strategy, views
    )


def _through_views(step: Step, aliases: Mapping[str, str]) -> Step:
    """`step` reading each view's value instead of the view; an in-place pair whose input is
    read under two names is dropped (see Views in the module docstring)."""
    reads = tuple(aliases.get(v, v) for v in step.reads)
    inplace = tuple(
        (out, aliases.get(donor, donor))
        for out, donor in step.inplace
        if reads.count(aliases.get(donor, donor)) == 1
    )
    return Step(reads, step.writes, inplace)


def _liveness(steps: Sequence[Step], sizes: Mapping[str, int]) -> tuple[dict, dict]:
    """(first step writing each value, last step reading it or, if none, writing it)."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for t, step in enumerate(steps):
        for v in step.writes:
            if v in sizes:
                first.setdefault(v, t)
                last[v] = max(last.get(v, t), t)
        for v in step.reads:
            if v in sizes:
                if v not in first:
                    raise ValueError(f"step {t} reads %{v} before any step writes it")
                last[v] = t
    return first, last


def _lower_bound(first: dict, last: dict, sizes: Mapping[str, int], n: int) -> int:
    delta = [0] * (n + 1)
    for v, t in first.items():
        delta[t] += sizes[v]
        delta[last[v] + 1] -= sizes[v]
    live = peak = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def _share_in_place(
    steps: Sequence[Step], sizes: Mapping[str, int], last: Mapping[str, int]
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(each value -> the first value of the buffer it lives in, the in-place pairs taken)."""
    owner: dict[str, str] = {}
    pairs: list[tuple[str, str]] = []
    for t, step in enumerate(steps):
        dying = {v for v in step.reads if v in sizes and last[v] == t}
        for out in _unique(step.writes):
            if out not in sizes or out in owner:
                continue
            owner[out] = out
            for o, donor in step.inplace:
                if o == out and donor in dying and sizes[donor] == sizes[out]:
                    owner[out] = owner[donor]
                    dying.discard(donor)  # its memory lives on as `out`
                    pairs.append((out, donor))
                    break
    return owner, pairs


@dataclass(frozen=True, order=True)
class _Buffer:
    """Memory one or more values share in place: live from step `first` to `last`."""

    first: int
    last: int
    size: int
    name: str


def _buffers(owner: Mapping[str, str], first: dict, last: dict, sizes: Mapping) -> list[_Buffer]:
    end: dict[str, int] = {}
    for v, root in owner.items():
        end[root] = max(end.get(root, 0), last[v])
    return sorted(_Buffer(first[r], end[r], align(sizes[r]), r) for r in end)


@dataclass(frozen=True, order=True)
class _Chunk:
    storage: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def _pool_place(buffers: list[_Buffer]) -> tuple[dict[str, _Chunk], list[int]]:
    """The storage pool of the module docstring: (chunk of each buffer, storage sizes)."""
    pool = _Pool()
    chunks: dict[str, _Chunk] = {}
    frees: dict[int, list[_Buffer]] = {}
    for b in buffers:  # sorted by first step
        for t in sorted(s for s in frees if s < b.first):
            for dead in frees.pop(t):
                pool.give(chunks[dead.name])
        chunks[b.name] = pool.take(b.size)
        frees.setdefault(b.last, []).append(b)
    return chunks, pool.capacity


class _Pool:
    """Storages (their capacities, in bytes) and their free chunks."""

    def __init__(self) -> None:
        self.capacity: list[int] = []
        self.free: set[_Chunk] = set()

    def take(self, nbytes: int) -> _Chunk:
        free = sorted(self.free)  # sorted: the plan must not depend on set order
        cls = size_class(nbytes)
        same = [c for c in free if c.size >= nbytes and size_class(c.size) == cls]
        larger = [c for c in free if c.size > nbytes]
        tails = [c for c in free if c.size < nbytes and c.end == self.capacity[c.storage]]
        if same:
            chosen = min(same, key=lambda c: (c.size, c))
            self.free.remove(chosen)
            return chosen
        if larger:
            chosen = min(larger, key=lambda c: (c.size, c))
            self.free.remove(chosen)
            self.free.add(_Chunk(chosen.storage, chosen.offset + nbytes, chosen.size - nbytes))
            return _Chunk(chosen.storage, chosen.offset, nbytes)
        if tails:
            chosen = max(tails, key=lambda c: (c.size, -c.storage))
            self.free.remove(chosen)
            self.capacity[chosen.storage] = chosen.offset + nbytes
            return _Chunk(chosen.storage, chosen.offset, nbytes)
        self.capacity.append(nbytes)
        return _Chunk(len(self.capacity) - 1, 0, nbytes)

    def give(self, chunk: _Chunk) -> None:
        """Return `chunk`, merged with the free chunks just before and after it."""
        for other in [c for c in self.free if c.storage == chunk.storage]:
            if other.end == chunk.offset or chunk.end == other.offset:
                self.free.remove(other)
                start = min(other.offset, chunk.offset)
                chunk = _Chunk(chunk.storage, start, other.size + chunk.size)
        self.free.add(chunk)


def _best_fit_place(buffers: list[_Buffer]) -> tuple[dict[str, _Chunk], list[int]]:
    """The best-fit arena of the module docstring: (chunk of each buffer, [arena size])."""
    placed: list[tuple[_Buffer, int]] = []
    chunks: dict[str, _Chunk] = {}
    for b in sorted(buffers, key=lambda b: (-b.size, b.first, b.name)):
        busy = sorted(
            (offset, offset + p.size)
            for p, offset in placed
            if p.first <= b.last and b.first <= p.last
        )
        best: tuple[int, int] | None = None  # (gap size, offset)
        top = 0
        for start, end in busy:
            if start - top >= b.size and (best is None or start - top < best[0]):
                best = (start - top, top)
            top = max(top, end)
        offset = best[1] if best is not None else top
        placed.append((b, offset))
        chunks[b.name] = _Chunk(0, offset, b.size)
    arena = max((c.end for c in chunks.values()), default=0)
    return chunks, [arena] if chunks else []


def _unique(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:10.3f} MiB"
