"""Greedy generation over the paged KV cache gives exactly the token ids of a plain numpy
GPT-2 that recomputes the whole sequence at every step (no cache), for one prompt and for a
batch of prompts of different lengths decoded together."""

import math

import numpy as np
import pytest

import hexir
from hexir.errors import HexirError
from hexir.frontend.zoo_transformer import gpt2_small
from hexir.serve.generate import Generator

SIZE = dict(layers=2, hidden=32, heads=2, vocab=100, seed=3)


def _weights(length: int) -> dict[str, np.ndarray]:
    """The zoo's GPT-2 weights at SIZE, as float64 numpy arrays by name."""
    graph = gpt2_small(seq=length, **SIZE)
    return {name: data.array.astype(np.float64) for name, data in graph.constants}


def _norm(x, gamma, beta):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * gamma + beta


def _numpy_logits(ids: list[int], w: dict[str, np.ndarray]) -> np.ndarray:
    """GPT-2's last logits over the whole sequence, in float64 numpy."""
    n, hidden, heads = len(ids), SIZE["hidden"], SIZE["heads"]
    d = hidden // heads
    x = w["wte"][ids] + w["wpe"][:n]
    hidden_mask = np.triu(np.full((n, n), -np.inf), k=1)
    for layer in range(SIZE["layers"]):
        p = f"h.{layer}."
        h = _norm(x, w[p + "ln_1.gamma"], w[p + "ln_1.beta"])
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, i * hidden : (i + 1) * hidden].reshape(n, heads, d) for i in range(3))
        scores = np.einsum("shd,thd->hst", q, k) / math.sqrt(d) + hidden_mask
        e = np.exp(scores - scores.max(-1, keepdims=True))
        context = np.einsum("hst,thd->shd", e / e.sum(-1, keepdims=True), v).reshape(n, hidden)
        x = x + context @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = _norm(x, w[p + "ln_2.gamma"], w[p + "ln_2.beta"])
        f = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        f = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f**3)))
        x = x + f @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return _norm(x[-1], w["ln_f.gamma"], w["ln_f.beta"]) @ w["wte"].T


def _numpy_greedy(prompt: list[int], new: int, w: dict[str, np.ndarray]) -> list[int]:
    ids = list(prompt)
    for _ in range(new):
        ids.append(int(np.argmax(_numpy_logits(ids, w))))
    return ids[len(prompt) :]


@pytest.fixture(scope="module")
def generator():
    return Generator(**SIZE, page_size=4, max_tokens=96)


def test_greedy_tokens_of_one_prompt_match_numpy(generator):
    prompt = [int(t) for t in np.random.default_rng().integers(0, 100, 9)]
    result = generator.generate([prompt], 64)
    assert result.tokens == [_numpy_greedy(prompt, 64, _weights(73))]


def test_a_batch_of_prompts_of_different_lengths_decodes_together(generator):
    rng = np.random.default_rng()
    prompts = [[int(t) for t in rng.integers(0, 100, n)] for n in (1, 6, 13, 4)]
    result = generator.generate(prompts, 64)
    w = _weights(13 + 64)
    assert result.tokens == [_numpy_greedy(p, 64, w) for p in prompts]
    # the pages in use grow with the tokens: ceil(tokens / 4) per sequence, after each step
    lengths = np.array([len(p) for p in prompts])
    want = [int(np.sum(-(-(lengths + step) // 4))) for step in range(1, 64)]
    assert result.pages_in_use == want
    assert result.decode_tokens_per_second > 0


def test_bad_prompts_are_refused_with_the_reason(generator):
    with pytest.raises(HexirError, match="outside the vocabulary"):
        generator.generate([[5, 100]], 4)
    with pytest.raises(HexirError, match="at least one prompt"):
        generator.generate([[]], 4)
    with pytest.raises(HexirError, match="past the 96 positions"):
        generator.generate([[1] * 90], 8)


@pytest.mark.parametrize("seq", [48, 192])  # one attention op; ops over blocks of queries
def test_the_prefill_plans_no_buffer_of_sequence_by_sequence(seq):
    module = hexir.compile(gpt2_small(seq=seq, **SIZE))
    assert any("attention" in report.ops for report in module.report)  # one attention kernel
    planned = [name for name, _ in module.plan.placements]
    assert planned  # the intermediates are planned, and none is [.., seq, .., seq, ..]
    square = [n for n in planned if list(module.value_type(n).shape).count(seq) >= 2]
    assert square == []


def test_the_cached_numpy_reference_agrees_with_recomputing_everything():
    from hexir.serve.reference import gpt2_weights, numpy_greedy

    prompt = [int(t) for t in np.random.default_rng().integers(0, 100, 7)]
    cached = numpy_greedy(prompt, 24, gpt2_weights(**SIZE), heads=SIZE["heads"])
    assert cached == _numpy_greedy(prompt, 24, _weights(31))


def test_the_decode_loop_is_a_vm_program_an_artifact_carries(generator, tmp_path):
    # The loop, its builtins over the cache and the decode module, saved and loaded: the
    # generator then decodes through the loaded program, to the same tokens.
    from hexir.runtime.vm import Call, CompiledProgram, Loop

    prompt = [int(t) for t in np.random.default_rng().integers(0, 100, 5)]
    want = generator.generate([prompt], 12).tokens
    key = (1, generator.max_pages, generator.table_pages(len(prompt) + 12), None)
    loop = generator._loops[key]
    (step,) = [s for s in loop.program.steps if isinstance(s, Loop)]
    assert {s.builtin for s in step.body.steps if isinstance(s, Call)} >= {"argmax", "kv_append"}
    loaded = hexir.runtime.load(loop.save(tmp_path / "decode.hxa"))
    assert isinstance(loaded, CompiledProgram) and loaded is not loop
    generator._loops[key] = loaded
    try:
        again = generator.generate([prompt], 12).tokens
        assert again == want == [_numpy_greedy(prompt, 12, _weights(17))]
    finally:
        generator._loops[key] = loop


def test_sampling_with_a_seed_is_reproducible_and_top_1_is_greedy(generator):
    from hexir.serve.generate import Sampling

    prompts = [[int(t) for t in np.random.default_rng().integers(0, 100, n)] for n in (3, 7)]
    greedy = generator.generate(prompts, 10).tokens
    assert generator.generate(prompts, 10, Sampling(seed=1, top_k=1)).tokens == greedy
    drawn = [generator.generate(prompts, 10, Sampling(seed=s, temperature=2.0)).tokens
             for s in (7, 7, 8)]  # fmt: skip
    assert drawn[0] == drawn[1] != drawn[2] and drawn[0] != greedy
    with pytest.raises(HexirError, match="temperature must be above 0"):
        Sampling(temperature=0)


def test_sample_draws_by_the_softmax_of_the_logits():
    from hexir.runtime.vm import sample

    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.tile(np.log(probs), (40000, 1))
    ids = sample(logits, 3, seed=11)
    np.testing.assert_allclose(np.bincount(ids, minlength=4) / len(ids), probs, atol=0.01)
    # top_k=2 keeps the two likeliest, renormalized; a temperature flattens the draw
    kept = np.bincount(sample(logits, 3, seed=11, top_k=2), minlength=4) / len(ids)
    np.testing.assert_allclose(kept, [0.625, 0.375, 0, 0], atol=0.01)
    hot = np.bincount(sample(logits, 3, seed=11, temperature=1e6), minlength=4) / len(ids)
    np.testing.assert_allclose(hot, [0.25] * 4, atol=0.01)
