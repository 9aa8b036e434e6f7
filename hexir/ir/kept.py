"""Values made from immutable objects, kept by the objects' identity within a scope.

    with keeping():                      # a build weighing several lowerings of one model
        key = kept(("workload_key",), (func,), lambda: digest(func))   # made once per func

Outside `keeping`, `kept` makes the value every time. Inside, the objects a value was made
from are held with it, so that no other object takes their ids while the scope lasts. Only
for values that depend on nothing but those objects (and the key's other parts): IR nodes and
constant arrays are never changed once made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["keeping", "kept"]

T = TypeVar("T")

# Per scope: (key, the objects' ids) -> (the objects, the value); None outside one.
_STORE: ContextVar[dict[tuple, tuple[tuple[object, ...], Any]] | None] = ContextVar(
    "hexir_kept", default=None
)


@contextlib.contextmanager
def keeping() -> Iterator[None]:
    """A scope in which `kept` makes each value once. Nested, the outer scope's values are
    shared."""
    store = _STORE.get()
    token = _STORE.set({} if store is None else store)
    try:
        yield
    finally:
        _STORE.reset(token)


def kept(key: tuple[Hashable, ...], objects: tuple[object, ...], make: Callable[[], T]) -> T:
    """`make()`, the value `key` names for `objects`: made once within a `keeping` scope."""
    store = _STORE.get()
    if store is None:
        return make()
    slot = (key, tuple(map(id, objects)))
    if slot not in store:
        store[slot] = (objects, make())
    return store[slot][1]
