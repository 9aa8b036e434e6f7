"""`hexir generate`: the token ids of each prompt, as `hexir.generate` makes them (or, with
--onnx, an exported decoder's OnnxDecoder), and clear errors for bad prompts."""

from pathlib import Path

import pytest

from hexir.cli import main
from hexir.serve.generate import Generator
from hexir.serve.onnx_decoder import OnnxDecoder

DECODER = Path(__file__).parents[1] / "frontend" / "fixtures" / "gpt2_tiny_past.onnx"

SMALL = ["--layers", "2", "--hidden", "32", "--heads", "2", "--vocab", "100", "--page-size", "4"]


@pytest.mark.slow
def test_generate_prints_each_prompts_new_ids_and_the_rates(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no tuning database here
    argv = ["generate", "gpt2-small", "--prompt-ids", "5,7,9", "--prompt-ids", "61"]
    assert main([*argv, "--max-new-tokens", "6", "--batch", "2", *SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    want = Generator(layers=2, hidden=32, heads=2, vocab=100, page_size=4).generate(
        [[5, 7, 9], [5, 7, 9], [61], [61]], 6
    )
    for i, (line, tokens) in enumerate(zip(out[:4], want.tokens, strict=True)):
        assert line.startswith(f"prompt {i} ") and line.endswith(",".join(map(str, tokens)))
    assert "decode" in out[4] and "tokens/s (4 sequences)" in out[4]
    assert "KV cache pages in use (4 tokens a page)" in out[4]


def test_generate_samples_with_a_seed(capsys, tmp_path, monkeypatch):
    from hexir.serve.generate import Sampling

    monkeypatch.chdir(tmp_path)
    argv = ["generate", "gpt2-small", "--prompt-ids", "5,7,9", "--max-new-tokens", "6", *SMALL]
    assert main([*argv, "--temperature", "1.5", "--seed", "4"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    want = Generator(layers=2, hidden=32, heads=2, vocab=100, page_size=4).generate(
        [[5, 7, 9]], 6, Sampling(seed=4, temperature=1.5)
    )
    assert line.endswith(",".join(map(str, want.tokens[0])))
    assert main([*argv, "--sample", "--temperature", "0"]) == 1
    assert "temperature must be above 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "ids, message",
    [("5,x", "not a comma-separated list"), ("5,100", "outside the vocabulary"), (",", "at least")],
)
def test_bad_prompt_ids_are_one_line_errors(ids, message, capsys):
    assert main(["generate", "gpt2-small", "--prompt-ids", ids, *SMALL]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hexir: error: ") and message in err and len(err.splitlines()) == 1


def test_generate_with_an_onnx_decoder_prints_its_ids(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "--onnx", str(DECODER), "--prompt-ids", "5,17,42", "--prompt-ids", "7"]
    assert main([*argv, "--max-new-tokens", "5", "--bucket", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    decoder = OnnxDecoder(DECODER, bucket=8)
    assert out[0] == f"prompt 0 (3 tokens): {','.join(map(str, decoder.generate([5, 17, 42], 5)))}"
    assert out[1] == f"prompt 1 (1 tokens): {','.join(map(str, decoder.generate([7], 5)))}"
    assert "specializations of gpt2_tiny_past (the past in buckets of 8 tokens)" in out[2]


@pytest.mark.parametrize(
    "args, message",
    [
        (["gpt2-small", "--onnx", str(DECODER)], "MODEL (gpt2-small) or --onnx FILE"),
        ([], "MODEL (gpt2-small) or --onnx FILE"),
        (["--onnx", str(DECODER.parent / "gpt2_tiny.onnx")], "lacks attention_mask"),
    ],
)
def test_a_model_and_a_decoder_are_one_or_the_other(args, message, capsys):
    assert main(["generate", *args, "--prompt-ids", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hexir: error: ") and message in err and len(err.splitlines()) == 1
