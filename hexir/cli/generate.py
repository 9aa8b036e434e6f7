"""`hexir generate gpt2-small --prompt-ids 464,2068,7586 --max-new-tokens 32 [--batch B]`:
greedy generation (hexir/serve/generate.py) over a paged KV cache, printing the new token ids
of each prompt, the prefill time and the decode rate; `--sample [--temperature T] [--top-k K]
[--seed S]` draws the tokens instead, reproducibly for a seed.

`hexir generate --onnx decoder.onnx --prompt-ids 5,17,42 [--bucket 16]`: the same with a
decoder exported to ONNX with past key/values (hexir/serve/onnx_decoder.py), each prompt on
its own, printing the new ids, the time and the specializations compiled."""

from __future__ import annotations

import argparse

from hexir.cli.common import DEFAULT_DB, open_database, require_database
from hexir.errors import HexirError

MODELS = ("gpt2-small",)


def add_parser(verbs: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "generate",
        parents=[parent],
        help="greedy text generation: token ids in, new token ids out (gpt2-small, or a "
        "decoder exported to ONNX with past key/values)",
        description="Generate MAX_NEW_TOKENS token ids greedily after each prompt with the "
        "zoo's GPT-2 small (its seeded random weights; --layers, --hidden, --heads and --vocab "
        "make a smaller one of the same structure). Each prompt is prefilled by a module "
        "compiled for its length; then all decode together, one token each per step, through "
        "one module whose attention reads every sequence's keys and values from a paged KV "
        "cache (pages of --page-size tokens). Prints the ids, the prefill time, decode tokens "
        "a second and the cache pages in use at the end. With --onnx FILE instead of MODEL: "
        "a decoder exported to ONNX with past key/values (input_ids, attention_mask, "
        "position_ids and past_key_values.<i>.key/value in; logits and present.<i>.* out, as "
        "Hugging Face exports them), imported with symbolic dims; its past is padded to "
        "multiples of --bucket tokens and masked, so each bucket compiles once.",
    )
    p.add_argument("model", metavar="MODEL", nargs="?", choices=MODELS, help="gpt2-small")
    p.add_argument(
        "--onnx", metavar="FILE",
        help="generate with this ONNX decoder (past key/values) instead of MODEL",
    )  # fmt: skip
    p.add_argument(
        "--bucket", metavar="B", type=int, default=16,
        help="with --onnx: pad the past to a multiple of B tokens (default 16)",
    )  # fmt: skip
    p.add_argument(
        "--prompt-ids", metavar="IDS", action="append", required=True,
        help="a prompt's token ids, comma-separated; repeat for more prompts (decoded together)",
    )  # fmt: skip
    p.add_argument("--max-new-tokens", metavar="N", type=int, default=16)
    p.add_argument(
        "--batch", metavar="B", type=int, default=1,
        help="decode B copies of each prompt together (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--sample", action="store_true",
        help="draw each token from the softmax of its logits instead of taking the argmax "
        "(implied by --temperature, --top-k and --seed)",
    )  # fmt: skip
    p.add_argument("--temperature", metavar="T", type=float, help="with --sample (default 1.0)")
    p.add_argument("--top-k", metavar="K", type=int, help="draw among the K likeliest")
    p.add_argument("--seed", metavar="S", type=int, help="the draws' seed (default 0)")
    p.add_argument("--page-size", metavar="S", type=int, default=16)
    p.add_argument(
        "--db", metavar="URL",
        help=f"the tuning database (default: {DEFAULT_DB}, where it exists)",
    )  # fmt: skip
    for name, default in (("layers", 12), ("hidden", 768), ("heads", 12), ("vocab", 50257)):
        p.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from hexir.serve.generate import Generator

    if (args.model is None) == (args.onnx is None):
        raise HexirError("generate takes a MODEL (gpt2-small) or --onnx FILE, one of them")
    prompts = [_ids(text) for text in args.prompt_ids]
    if args.batch < 1:
        raise HexirError(f"--batch must be at least 1, got {args.batch}")
    prompts = [p for p in prompts for _ in range(args.batch)]
    db = require_database(args.db) if args.db else open_database(DEFAULT_DB, create=False)
    if args.onnx is not None:
        return _generate_onnx(args, prompts, db)
    generator = Generator(
        layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab,
        page_size=args.page_size, database=db,
    )  # fmt: skip
    result = generator.generate(prompts, args.max_new_tokens, _sampling(args))
    for i, (prompt, tokens) in enumerate(zip(prompts, result.tokens, strict=True)):
        print(f"prompt {i} ({len(prompt)} tokens): {','.join(map(str, tokens))}")
    pages = result.pages_in_use[-1] if result.pages_in_use else 0
    n = len(prompts)
    print(
        f"compile {result.compile_seconds:.1f} s; prefill {result.prefill_seconds * 1e3:.1f} ms "
        f"({_count(n, 'prompt')}); decode {result.decode_tokens_per_second:.1f} tokens/s "
        f"({_count(n, 'sequence')}); {pages} KV cache pages in use ({args.page_size} tokens a "
        "page)"
    )
    return 0


def _generate_onnx(args: argparse.Namespace, prompts: list[list[int]], db: object) -> int:
    import time

    from hexir.serve.onnx_decoder import OnnxDecoder

    start = time.perf_counter()
    decoder = OnnxDecoder(args.onnx, bucket=args.bucket, database=db)
    for i, prompt in enumerate(prompts):
        tokens = decoder.generate(prompt, args.max_new_tokens)
        print(f"prompt {i} ({len(prompt)} tokens): {','.join(map(str, tokens))}")
    seconds = time.perf_counter() - start
    compiled = len(decoder.module.specializations)
    print(
        f"{seconds:.1f} s, compiling included: {_count(compiled, 'specialization')} of "
        f"{decoder.graph.name} (the past in buckets of {args.bucket} tokens)"
    )
    return 0


def _sampling(args: argparse.Namespace):  # -> Sampling | None
    """The draws the flags ask for, or None for greedy decoding."""
    from hexir.serve.generate import Sampling

    given = {
        key: value
        for key, value in (
            ("temperature", args.temperature), ("top_k", args.top_k), ("seed", args.seed)
        )
        if value is not None
    }  # fmt: skip
    return Sampling(**given) if args.sample or given else None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise HexirError(
            f"--prompt-ids {text!r} is not a comma-separated list of token ids (e.g. 464,2068)"
        ) from None
    if not ids:
        raise HexirError("--prompt-ids needs at least one token id")
    return ids
