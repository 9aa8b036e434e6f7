"""Every error Hexir raises is a HexirError; every one pickles (it crosses Ray)."""

from __future__ import annotations

from collections.abc import Callable


class HexirError(Exception):
    """Base class of every error Hexir raises on purpose."""

    def __reduce__(self):  # noqa: D105 - pickling rebuilds from the message alone
        return (type(self), (str(self),))


class KnobError(HexirError):
    """An environment variable of a knob (hexir/knobs.py) that does not parse."""


class ParseError(HexirError):
    """Text that does not parse: line, column, the line itself and a caret under the column."""

    def __init__(self, message: str, line: int = 0, column: int = 0, source_line: str = ""):
        self.message = message
        self.line = line
        self.column = column
        self.source_line = source_line
        if line:
            caret = " " * (column - 1) + "^"
            text = f"{message} (line {line}, column {column})\n  {source_line}\n  {caret}"
        else:
            text = message
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.message, self.line, self.column, self.source_line))


class TypeInferenceError(HexirError):
    """A graph op whose operands or attributes do not fit: names the op and prints it."""


class ScheduleError(HexirError):
    """A schedule primitive that would change the result or cannot apply.

    `ScheduleError(reason, primitive, ir)`: `ir` is the printed IR with the offending loop or
    block marked, or a function that prints it; it is printed only when the message is asked
    for, so the search's inner loop pays for `brief()` alone.
    """

    def __init__(self, message: str, primitive: str = "", ir: str | Callable[[], str] = ""):
        super().__init__(message)
        self.reason = message
        self.primitive = primitive
        self._ir = ir

    @property
    def ir(self) -> str:
        if callable(self._ir):
            self._ir = self._ir()
        return self._ir

    def brief(self) -> str:
        """One line: the primitive and the first line of the reason."""
        first = self.reason.splitlines()[0] if self.reason else ""
        return f"{self.primitive}: {first}" if self.primitive else first

    def __str__(self) -> str:
        head = f"{self.primitive}: {self.reason}" if self.primitive else self.reason
        ir = self.ir
        return f"{head}\n{ir}" if ir else head

    def __reduce__(self):
        return (type(self), (self.reason, self.primitive, self.ir))


class ResourceError(HexirError):
    """A kernel over a target's limits (threads per block, shared memory, ...)."""


class BuildError(HexirError):
    """A compiler failure: carries the generated source and the compiler's log."""

    def __init__(self, message: str, source: str = "", log: str = ""):
        self.message = message
        self.source = source
        self.log = log
        text = message
        if log:
            text += f"\n--- compiler log ---\n{log.rstrip()}"
        if source:
            numbered = "\n".join(f"{n:4d}  {line}" for n, line in enumerate(source.splitlines(), 1))
            text += f"\n--- source ---\n{numbered}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.message, self.source, self.log))


class MeasureError(HexirError):
    """A run that failed: what failed and a command that reproduces it."""


class TargetError(HexirError):
    """A target string that names no known target, or a machine that lacks the target."""


class VerifyError(HexirError):
    """A PrimFunc that breaks the hextir invariants: every problem found, each naming its node."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        self.problems = tuple(problems)
        text = message
        if self.problems:
            text += "".join(f"\n  - {p}" for p in self.problems)
        super().__init__(text)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.message, self.problems))


class DatabaseError(HexirError):
    """A tuning database that cannot be opened, read or written: one line naming the URL."""


class ModelError(HexirError):
    """A model that cannot be loaded: an unknown zoo name, a missing or foreign file, or an
    ONNX model with unsupported nodes (`problems` lists every one)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()):
        self.problems = tuple(problems)
        text = message
        if self.problems:
            text += "".join(f"\n  - {p}" for p in self.problems)
        super().__init__(text)
        self.message = message

    def __reduce__(self):
        return (type(self), (self.message, self.problems))


class ArtifactError(HexirError):
    """An artifact file that cannot be loaded: not an artifact, or written by another version."""


class SpaceError(HexirError):
    """A workload for which the search space yields no valid schedule within its attempts."""


class CostModelError(HexirError):
    """A saved cost model that cannot be loaded: a missing file, another model's format, or a
    model whose features differ from this version's."""
