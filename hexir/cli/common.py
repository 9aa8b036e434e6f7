"""What every verb of the `hexir` command shares: what MODEL means, the default target, the
database, random inputs, argument types and number formats."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hexir.errors import DatabaseError, HexirError, ModelError

if TYPE_CHECKING:
    from hexir.database import Database
    from hexir.ir.graph import Graph
    from hexir.ir.tir import PrimFunc
    from hexir.runtime.target import Target

DEFAULT_DB = "sqlite:///tuning_logs/hexir.db"
MODEL_HELP = (
    "a zoo model (mlp, resnet18, resnet50, bert-base, gpt2, gpt2-decode), a .hexir or .onnx "
    "file, or a workload such as matmul:M=1024,N=1024,K=1024"
)


def parse_workload_spec(spec: str) -> tuple[str, dict[str, object]]:
    """`"matmul:M=1024,N=1024,K=1024"` → `("matmul", {"M": 1024, "N": 1024, "K": 1024})`."""
    name, _, rest = spec.partition(":")
    if not name.isidentifier():
        raise HexirError(f"{spec!r} is not a workload: expected NAME:KEY=VALUE,... ")
    params: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.isidentifier():
            raise HexirError(
                f"workload {spec!r}: {item!r} is not KEY=VALUE "
                "(write e.g. matmul:M=1024,N=1024,K=1024)"
            )
        params[key] = _parse_value(value)
    return name, params


def _parse_value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", ""):
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def is_workload_spec(text: str) -> bool:
    """Whether MODEL names a workload (`matmul:M=64,...`) rather than a model or a file."""
    name, colon, _ = text.partition(":")
    return bool(colon) and name.isidentifier() and not Path(text).exists()


def load_workload(spec: str) -> PrimFunc:
    import hexir

    name, params = parse_workload_spec(spec)
    return hexir.workload(name, **params)


@dataclass(frozen=True)
class Subject:
    """What a MODEL argument named: a graph (zoo, .hexir, .onnx) or one workload's PrimFunc."""

    text: str
    graph: Graph | None = None
    func: PrimFunc | None = None

    @property
    def tunable(self) -> Graph | PrimFunc:
        found = self.graph if self.graph is not None else self.func
        assert found is not None
        return found

    @property
    def model(self) -> Graph:
        """The graph (for a subject `load_graph` gave, which is never a workload)."""
        assert self.graph is not None, "a workload has no graph"
        return self.graph

    @property
    def stem(self) -> str:
        """A file name stem for what this subject writes (`resnet18`, `model` for model.onnx)."""
        if self.graph is None:
            return self.text.partition(":")[0]
        return Path(self.text).stem if Path(self.text).suffix else self.text


def add_dim_argument(p: argparse.ArgumentParser) -> None:
    """`--dim NAME=SIZE`, repeated: sizes of an ONNX model's symbolic dims (`dims` of
    `load_subject`)."""
    p.add_argument(
        "--dim", metavar="NAME=SIZE", action="append", type=dim_binding, default=[],
        help="an .onnx model exported with dynamic axes: the size of its symbolic dim NAME "
        "(a dim_param such as sequence_length); repeat for each. The model is compiled for "
        "those sizes",
    )  # fmt: skip


def dim_binding(text: str) -> tuple[str, int]:
    """`"sequence=128"` → `("sequence", 128)`, for argparse."""
    name, eq, size = text.partition("=")
    if not eq or not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=SIZE with a positive size (e.g. --dim sequence_length=128)"
        )
    return name, int(size)


def load_subject(
    text: str,
    dims: list[tuple[str, int]] | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    symbolic: bool = False,
) -> Subject:
    """A model (zoo name, .hexir, .onnx; an .onnx's symbolic dims sized by `dims` and
    `input_shapes`, see `hexir.frontend.onnx_import`) or a workload spec."""
    if is_workload_spec(text):
        if dims:
            raise HexirError(
                f"--dim sizes an .onnx model's symbolic dims, and {text!r} is a workload, "
                "whose sizes are its parameters: drop --dim"
            )
        return Subject(text, func=load_workload(text))
    import hexir

    named = [name for name, _ in dims or ()]
    twice = sorted({n for n in named if named.count(n) > 1})
    if twice:
        raise HexirError(f"--dim sizes {', '.join(twice)} more than once: give each dim once")
    graph = hexir.load_model(
        text, dims=dict(dims or ()), input_shapes=input_shapes, symbolic=symbolic
    )
    return Subject(text, graph=graph)


def load_graph(
    text: str,
    verb: str,
    dims: list[tuple[str, int]] | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    symbolic: bool = False,
) -> Subject:
    """A model, refusing a workload spec (verbs that compile or export a whole graph)."""
    if is_workload_spec(text):
        raise ModelError(
            f"hexir {verb} takes a model (a zoo name, a .hexir or an .onnx file), and "
            f"{text!r} is a single workload: tune it with `hexir tune {text}`, look at its best "
            f"schedule with `hexir show {text} --schedule best`, and run it with the tuned "
            f"schedule with `hexir run {text} --db URL`."
        )
    return load_subject(text, dims, input_shapes, symbolic)


def default_target() -> str:
    """`cuda` when a GPU can run kernels here, else `cpu`."""
    from hexir.runtime.cuda_kernel import gpu_unavailable_reason

    return "cuda" if gpu_unavailable_reason() is None else "cpu"


def resolve_target(text: str | None) -> Target:
    """The Target `--target` names (checked before anything else is opened), or the default."""
    from hexir.runtime.target import Target

    return Target(text if text is not None else default_target())


def open_database(url: str, *, create: bool) -> Database | None:
    """The database at `url`. Where it is a SQLite file that does not exist: a new one when
    `create`, else None (nothing to read, and no empty file left behind)."""
    from hexir.database import Database

    path = sqlite_path(url)
    if not create and path is not None and not path.exists():
        return None
    return Database(url)


def require_database(url: str) -> Database:
    """The database at `url`, or DatabaseError when it is a SQLite file that does not exist."""
    db = open_database(url, create=False)
    if db is None:
        raise DatabaseError(
            f"no tuning database at {url}: the file does not exist. Pass the URL a tune wrote "
            f"to with --db (the default is {DEFAULT_DB}, relative to the current folder)."
        )
    return db


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for another backend or an in-memory database)."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    rest = url[len(prefix) :].partition("?")[0]
    if not rest or rest == ":memory:" or rest.startswith("file:"):
        return None
    return Path(rest).expanduser()


def positive_int(text: str) -> int:
    """An argparse type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


_NUMBER = r"\d+(?:\.\d*)?"
_SPAN = re.compile(rf"(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s?)?")


def time_span(text: str) -> float:
    """An argparse type: a span of time above zero, in seconds: `90`, `90s`, `30m`, `1.5h`,
    `1h30m`."""
    match = _SPAN.fullmatch(text.strip().lower())
    seconds = 0.0
    if match is not None and text.strip():
        h, m, s = (float(match[k] or 0) for k in "hms")
        seconds = h * 3600 + m * 60 + s
    if not seconds > 0:
        raise argparse.ArgumentTypeError(
            f"expected a span of time such as 90s, 30m, 1.5h or 1h30m, got {text!r}"
        )
    return seconds


def ms(seconds: float | None, width: int = 0) -> str:
    """Seconds as milliseconds (3 decimals, 4 below 1 ms), or `-` when unknown."""
    if seconds is None:
        text = "-"
    else:
        # Four decimals below a millisecond: tuned small kernels take microseconds.
        text = f"{seconds * 1e3:.3f}" if seconds >= 1e-3 else f"{seconds * 1e3:.4f}"
    return text.rjust(width)


def ratio(before: float | None, after: float | None) -> str:
    """`before / after` as `1.84x`, or `-`."""
    if before is None or after is None or after <= 0:
        return "-"
    return f"{before / after:.2f}x"


def duration(seconds: float | None) -> str:
    """`2m05s`, `41s`, or `-`."""
    if seconds is None:
        return "-"
    total = int(round(seconds))
    if total >= 3600:
        return f"{total // 3600}h{total % 3600 // 60:02d}m"
    return f"{total // 60}m{total % 60:02d}s" if total >= 60 else f"{total}s"


def plural(n: int, word: str) -> str:
    """`1 task`, `2 tasks`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
