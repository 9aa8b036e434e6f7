"""Traces: a schedule as data, printable as Python, serializable as JSON, replayable.

    b0 = sch.get_block(name="matmul")
    l1, l2, l3 = sch.get_loops(block=b0)
    v4, v5 = sch.sample_perfect_tile(loop=l1, n=2, max_innermost_factor=16, decision=[64, 16])
    l6, l7 = sch.split(loop=l1, factors=[v4, v5])
    sch.parallel(loop=l6)

Random variables (`BlockRV`, `LoopRV`, `ExprRV`) are numbered by position of definition across
the trace's outputs; an instruction's inputs refer to earlier outputs by that number, so a
trace replays on any PrimFunc with the same structure whatever its names.

JSON form (one object; RVs in inputs are `{"rv": "l1"}`, tuples are lists):

    {"format": "hexir.trace", "version": 1, "instructions": [
      {"kind": "get_block", "inputs": {}, "attrs": {"name": "matmul"},
       "outputs": ["b0"], "decision": null}, ...]}
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Union

from hexir.errors import ScheduleError

if TYPE_CHECKING:
    from hexir.ir.tir import PrimFunc
    from hexir.schedule.schedule import Schedule


class RV:
    """A random variable: a handle on a block, a loop or an integer of a schedule."""

    __slots__ = ()
    prefix: ClassVar[str] = "?"
    index: int
    sch: object

    @property
    def trace_name(self) -> str:
        """The name the trace gives it: `b0`, `l1`, `v4`."""
        return f"{self.prefix}{self.index}"

    def __repr__(self) -> str:
        # A handle prints as what it points at; a trace's bare RV as its trace name.
        describe = getattr(self.sch, "describe", None)
        return describe(self) if describe is not None else self.trace_name

    __str__ = __repr__


@dataclass(frozen=True, slots=True, repr=False)
class BlockRV(RV):
    prefix: ClassVar[str] = "b"
    index: int
    sch: object = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, repr=False)
class LoopRV(RV):
    prefix: ClassVar[str] = "l"
    index: int
    sch: object = field(default=None, compare=False)


@dataclass(frozen=True, slots=True, repr=False)
class ExprRV(RV):
    prefix: ClassVar[str] = "v"
    index: int
    sch: object = field(default=None, compare=False)


RV_CLASSES: dict[str, type[RV]] = {"b": BlockRV, "l": LoopRV, "v": ExprRV}

# A value in an instruction: an RV, a plain constant, or a tuple of them.
Value = Union[RV, int, float, str, bool, None, tuple["Value", ...]]

# Instructions whose result is a list, printed `l1, l2 = ...` (`l1, = ...` when one long).
LIST_RESULTS = frozenset({"get_loops", "get_child_blocks", "split", "sample_perfect_tile"})


def freeze(value: object) -> Value:
    """`value` as an instruction holds it: lists become tuples, RVs lose their schedule."""
    match value:
        case RV():
            return type(value)(value.index)  # type: ignore[call-arg]
        case list() | tuple():
            return tuple(freeze(v) for v in value)
        case None | bool() | int() | float() | str():
            return value
    raise TypeError(f"not a trace value: {value!r}")


@dataclass(frozen=True, slots=True, repr=False)
class Instruction:
    """One primitive applied: `inputs` may hold RVs (earlier outputs) and plain values, `attrs`
    plain values only; both are (name, value) pairs in call order. A name starting with `*`
    is a variadic argument (`sch.fuse(l1, l2)`). `decision` is set on sampling instructions."""

    kind: str
    inputs: tuple[tuple[str, Value], ...]
    attrs: tuple[tuple[str, Value], ...]
    outputs: tuple[RV, ...]
    decision: Value = None

    def __str__(self) -> str:
        args = [_py(v, star=True) for k, v in self.inputs if k.startswith("*")]
        args += [f"{k}={_py(v)}" for k, v in self.inputs + self.attrs if not k.startswith("*")]
        if self.decision is not None:
            args.append(f"decision={_py(self.decision)}")
        call = f"sch.{self.kind}({', '.join(args)})"
        names = [rv.trace_name for rv in self.outputs]
        if self.kind in LIST_RESULTS:
            lhs = "_" if not names else ", ".join(names) + ("," if len(names) == 1 else "")
        elif not names:
            return call
        else:
            lhs = ", ".join(names)
        return f"{lhs} = {call}"

    __repr__ = __str__


def _py(value: Value, star: bool = False) -> str:
    """`value` as Python source; with `star`, a tuple's items as separate arguments."""
    match value:
        case RV():
            return value.trace_name
        case tuple():
            items = ", ".join(_py(v) for v in value)
            return items if star else f"[{items}]"
        case str():
            return json.dumps(value)
        case _:
            return repr(value)


# Trace.apply's `adapt`: (schedule, instruction, its inputs as the schedule's RVs) -> a
# decision to try instead of the instruction's own, or None.
Adapter = Callable[["Schedule", "Instruction", dict[str, object]], object]


@dataclass(frozen=True, slots=True, repr=False)
class Trace:
    """An immutable sequence of instructions; see the module docstring."""

    instructions: tuple[Instruction, ...] = ()

    def __str__(self) -> str:
        return "\n".join(str(inst) for inst in self.instructions)

    __repr__ = __str__

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    @property
    def decisions(self) -> list[tuple[int, Value]]:
        """(instruction index, decision) of every sampling instruction, in order."""
        return [(n, i.decision) for n, i in enumerate(self.instructions) if i.decision is not None]

    def with_decision(self, index: int, value: object) -> Trace:
        """A new trace with instruction `index`'s decision replaced (checked on replay)."""
        if not 0 <= index < len(self.instructions):
            raise IndexError(f"no instruction {index} in a trace of {len(self.instructions)}")
        inst = self.instructions[index]
        if inst.decision is None:
            raise ValueError(f"instruction {index} ({inst.kind}) makes no decision")
        new = Instruction(inst.kind, inst.inputs, inst.attrs, inst.outputs, freeze(value))
        return Trace(self.instructions[:index] + (new,) + self.instructions[index + 1 :])

    def apply(
        self,
        func: PrimFunc,
        *,
        target: object = None,
        seed: int | None = None,
        adapt: Adapter | None = None,
    ) -> Schedule:
        """Replay on `func`: a new Schedule. Raises ScheduleError if any instruction fails.
        `seed` draws for sampling instructions that carry no decision (hand-written traces).
        `adapt`, where given, is asked for another decision of a sampling instruction whose
        own does not replay (a tile recorded on a loop of another extent): it gets the
        schedule, the instruction and its inputs as the schedule's RVs, and returns the
        decision to try instead (None: the error stands)."""
        from hexir.schedule.schedule import Schedule

        sch = Schedule(func, target=target, seed=seed)
        env: dict[RV, RV] = {}
        for n, inst in enumerate(self.instructions):
            try:
                _replay(sch, n, inst, env)
            except ScheduleError:
                if adapt is None or inst.decision is None:
                    raise
                inputs = {k: env.get(v, v) if isinstance(v, RV) else v for k, v in inst.inputs}
                decision = adapt(sch, inst, inputs)
                if decision is None:
                    raise
                again = Instruction(
                    inst.kind, inst.inputs, inst.attrs, inst.outputs, freeze(decision)
                )
                _replay(sch, n, again, env)
        return sch

    def to_json(self) -> str:
        insts = [
            {
                "kind": i.kind,
                "inputs": {k: _to_json(v) for k, v in i.inputs},
                "attrs": {k: _to_json(v) for k, v in i.attrs},
                "outputs": [rv.trace_name for rv in i.outputs],
                "decision": _to_json(i.decision),
            }
            for i in self.instructions
        ]
        return json.dumps({"format": "hexir.trace", "version": 1, "instructions": insts})

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """The trace `to_json` wrote; ValueError on anything else."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != "hexir.trace":
            raise ValueError("not a hexir trace: expected a {'format': 'hexir.trace'} object")
        if data.get("version") != 1:
            raise ValueError(f"unsupported hexir trace version {data.get('version')!r}")
        defined: dict[str, RV] = {}
        return cls(tuple(_inst_from_json(d, defined) for d in data.get("instructions", [])))


def _replay(sch: Schedule, n: int, inst: Instruction, env: dict[RV, RV]) -> None:
    method = getattr(type(sch), inst.kind, None)
    if not getattr(method, "is_primitive", False):
        raise ScheduleError(f"instruction {n}: unknown primitive {inst.kind!r}", inst.kind)

    def resolve(v: Value) -> object:
        if isinstance(v, RV):
            return env[v]
        return tuple(resolve(x) for x in v) if isinstance(v, tuple) else v

    args = [a for k, v in inst.inputs if k.startswith("*") for a in resolve(v)]  # type: ignore
    kwargs = {k: resolve(v) for k, v in inst.inputs + inst.attrs if not k.startswith("*")}
    if inst.decision is not None:
        kwargs["decision"] = inst.decision
    try:
        result = getattr(sch, inst.kind)(*args, **kwargs)
    except ScheduleError as e:
        ir = lambda err=e: err.ir  # noqa: E731 - printed only if the message is asked for
        raise ScheduleError(f"replaying `{inst}`: {e.reason}", e.primitive, ir) from e
    outs = [] if result is None else list(result) if isinstance(result, list) else [result]
    if [type(o) for o in outs] != [type(o) for o in inst.outputs]:
        raise ScheduleError(
            f"replaying `{inst}`: it returned {outs} here; the trace expects "
            f"{len(inst.outputs)} outputs",
            inst.kind,
        )
    env.update(zip(inst.outputs, outs, strict=True))


def _to_json(value: Value) -> object:
    match value:
        case RV():
            return {"rv": value.trace_name}
        case tuple():
            return [_to_json(v) for v in value]
        case _:
            return value


_RV_NAME = re.compile(r"^([blv])(\d+)$")


def _inst_from_json(d: object, defined: dict[str, RV]) -> Instruction:
    if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
        raise ValueError(f"not a trace instruction: {d!r}")
    if not d["kind"].isidentifier():
        raise ValueError(f"not a primitive name: {d['kind']!r}")

    def value(v: object) -> Value:
        if isinstance(v, dict):
            name = v.get("rv")
            if set(v) != {"rv"} or name not in defined:
                raise ValueError(f"{d['kind']}: {v!r} refers to no earlier output")
            return defined[name]
        if isinstance(v, list):
            return tuple(value(x) for x in v)
        return freeze(v)

    inputs = tuple((str(k), value(v)) for k, v in dict(d.get("inputs", {})).items())
    attrs = tuple((str(k), freeze(_plain(v))) for k, v in dict(d.get("attrs", {})).items())
    outputs = []
    for name in d.get("outputs", []):
        m = _RV_NAME.match(str(name))
        if m is None or int(m.group(2)) != len(defined):
            raise ValueError(f"{d['kind']}: output {name!r} is not numbered by its position")
        rv = RV_CLASSES[m.group(1)](int(m.group(2)))  # type: ignore[call-arg]
        defined[name] = rv
        outputs.append(rv)
    decision = freeze(_plain(d.get("decision")))
    return Instruction(d["kind"], inputs, attrs, tuple(outputs), decision)


def _plain(v: object) -> object:
    if isinstance(v, dict):
        raise ValueError(f"an RV where only plain values may be: {v!r}")
    return [_plain(x) for x in v] if isinstance(v, list) else v
