"""The `hexir` command (also `python -m hexir`).

    hexir tune resnet18 --trials 600              # tune every kernel, record to the database
    hexir build resnet18 -o resnet18.hxa          # the best schedules, no search
    hexir run resnet18.hxa --bench                # run and time the artifact
    hexir db list | hexir db best WORKLOAD        # what the database knows
    hexir show matmul:M=1024,N=1024,K=1024 --schedule best
    hexir export resnet18 -o resnet18.onnx
    hexir quantize gpt2-decode -o gpt2-int8.hexir  # int8 linear layers
    hexir generate gpt2-small --prompt-ids 464,2068 --max-new-tokens 32

Errors print as one paragraph and exit with status 1 (bad arguments: 2; Ctrl-C: 130);
`--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hexir.cli import build, db, generate, quantize, run, show, tune
from hexir.cli.common import parse_workload_spec
from hexir.errors import HexirError, KnobError

__all__ = ["build_parser", "main", "parse_workload_spec"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb; each verb's handler is `args.handler`."""
    parser = argparse.ArgumentParser(
        prog="hexir",
        description="Hexir: a tensor compiler that searches for fast schedules.",
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    # Every verb takes --debug too, after its own arguments; SUPPRESS keeps the top one's value.
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks"
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    tune.add_parser(verbs, parent)
    build.add_parsers(verbs, parent)
    run.add_parser(verbs, parent)
    db.add_parser(verbs, parent)
    show.add_parser(verbs, parent)
    quantize.add_parser(verbs, parent)
    generate.add_parser(verbs, parent)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); the exit status."""
    try:
        parser = build_parser()  # its help texts read the knobs
    except KnobError as error:
        print(f"hexir: error: {error}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # The reader went away (`hexir show ... | head`): nothing more to say to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (HexirError, OSError) as error:
        if args.debug:
            raise
        print(f"hexir: error: {_paragraph(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("hexir: interrupted", file=sys.stderr)
        return 130


def _paragraph(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None:
        reason = error.strerror or type(error).__name__
        return f"{error.filename}: {reason}"
    return str(error)


if __name__ == "__main__":
    sys.exit(main())
