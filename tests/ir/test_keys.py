from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tir_fixtures import ALL, matmul, scheduled_gpu

from hexir.ir.keys import candidate_key, workload_key
from hexir.ir.tir import Buffer, BufferStore, FloatImm, For, PrimFunc, Var, seq
from hexir.ir.tir_text import parse_func, print_canonical, print_func

RENAMED = ("mm", "X", "Y", "Z", "a", "b", "c", "p", "q", "r")

# The canonical form is the database's key: changing it is a migration, so it is pinned here.
MATMUL_CANONICAL = """\
hextir.func @f(%b0: buffer<1024x1024xf32>, %b1: buffer<1024x1024xf32>, %b2: buffer<1024x1024xf32>) {
  for %v0 in 0..1024 serial {
    for %v1 in 0..1024 serial {
      for %v2 in 0..1024 serial {
        block @matmul(v3 = spatial(1024) %v0, v4 = spatial(1024) %v1, v5 = reduce(1024) %v2) reads(%b0[v3, v5], %b1[v5, v4]) writes(%b2[v3, v4]) {
          init {
            %b2[v3, v4] = 0.0
          }
          %b2[v3, v4] = %b2[v3, v4] + %b0[v3, v5] * %b1[v5, v4]
        }
      }
    }
  }
}"""  # noqa: E501
MATMUL_KEY = "5985f7ed802b435e7f10b430cbea9c0e2772530724c77f4f8528dbd1edf66007"


def test_canonical_text_is_pinned() -> None:
    assert print_canonical(matmul()) == MATMUL_CANONICAL


def test_key_is_a_sha256_hex_digest() -> None:
    key = workload_key(matmul())
    assert key == MATMUL_KEY
    assert candidate_key(matmul()) == key


def test_names_and_attrs_do_not_change_the_key() -> None:
    key = workload_key(matmul())
    assert workload_key(matmul(names=RENAMED)) == key
    assert workload_key(matmul(attrs=(("op", "hexir.matmul"), ("note", "x")))) == key


def test_structure_changes_the_key() -> None:
    keys = {
        workload_key(matmul()),
        workload_key(matmul(n=512)),
        workload_key(matmul(dtype="float64")),
        workload_key(matmul(kind="parallel")),
        workload_key(matmul(op="-")),
        *(workload_key(make()) for make in ALL[1:]),
    }
    assert len(keys) == 4 + len(ALL)


def test_num_outputs_and_block_names_are_part_of_the_key() -> None:
    func = matmul()
    two_outputs = PrimFunc(func.name, func.params, func.body, 2)
    assert workload_key(two_outputs) != workload_key(func)
    # Traces find blocks by name, so a block's name is part of what a trace replays on.
    gemm = parse_func(print_func(func).replace("block @matmul(", "block @gemm("))
    assert workload_key(gemm) != workload_key(func)


def _siblings(second: str) -> PrimFunc:
    out = Buffer("out", (4,))
    i, other = Var("i"), Var(second)
    body = seq(
        For(i, 4, "serial", BufferStore(out, (i,), FloatImm(0.0))),
        For(other, 4, "serial", BufferStore(out, (other,), FloatImm(1.0))),
    )
    return PrimFunc("s", (out,), body)


def test_names_are_numbered_per_binding_site() -> None:
    # Reusing a loop var name for a sibling loop is the same computation as a fresh name.
    assert workload_key(_siblings("i")) == workload_key(_siblings("j"))


def test_key_is_the_same_in_another_process() -> None:
    here = Path(__file__).parent
    code = "from tir_fixtures import scheduled_gpu; from hexir.ir.keys import candidate_key; "
    code += "print(candidate_key(scheduled_gpu()))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=here, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == candidate_key(scheduled_gpu())


def test_within_keeping_a_func_object_is_printed_once_for_its_key(monkeypatch) -> None:
    import hexir.ir.keys as keys
    from hexir.ir.kept import keeping

    printed: list[PrimFunc] = []

    def counting(func: PrimFunc) -> str:
        printed.append(func)
        return print_canonical(func)

    monkeypatch.setattr(keys, "print_canonical", counting)
    a, b = matmul(), matmul()  # equal funcs, two objects
    assert workload_key(a) == workload_key(a) == MATMUL_KEY and len(printed) == 2  # outside
    printed.clear()
    with keeping():
        assert [workload_key(f) for f in (a, b, a, b, a)] == [MATMUL_KEY] * 5
        with keeping():  # nested: the outer scope's keys
            assert workload_key(a) == MATMUL_KEY
        assert printed == [a, b]  # once per object
        other = parse_func(print_func(ALL[1]()))  # a func of other text keeps its own key
        assert workload_key(other) == workload_key(ALL[1]()) != MATMUL_KEY
    printed.clear()
    workload_key(a)
    assert printed == [a]  # the scope is over: printed again
