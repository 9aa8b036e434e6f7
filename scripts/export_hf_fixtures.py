"""Export tiny Hugging Face models to ONNX, as test fixtures: two language models that take
token ids (GPT-2 also as a decoder with past key/values), and four image classifiers that take
pixels, each at three opsets.

    pip install torch==2.13.0 "transformers==4.57.*" onnx onnxscript onnxruntime  # not Hexir's
    python scripts/export_hf_fixtures.py [OUT_DIR]    # default tests/frontend/fixtures

Random weights (seeded), tiny configurations, so each file is a few hundred KB at most.

Language models (2 layers, hidden 32, vocab 100, 16 tokens): BERT through PyTorch's legacy
(TorchScript) exporter at opset 17 (it writes ConstantOfShape for the attention mask), GPT-2
through the dynamo exporter at opset 18 (IsNaN around the attention's softmax; the legacy
exporter fails on GPT-2 with transformers 4.57). Both start with an embedding lookup of
`input_ids`: a Gather whose indices are a graph input.

GPT-2 with past key/values, `gpt2_tiny_past.onnx` (the same configuration as gpt2_tiny but 32
positions, weights of its own seed drawn 10x wider, so that greedy generation does not repeat
one token; dynamo exporter, opset 18), as a generation loop calls it: inputs input_ids and
position_ids [batch, sequence], attention_mask [batch, total_sequence] (1 for a token to
attend to; its length is past_sequence + sequence) and past_key_values.<layer>.key/value
[batch, 2, past_sequence, 16]; outputs logits [batch, sequence, 100] and
present.<layer>.key/value [batch, 2, past_sequence + sequence, 16], every size a dim_param.
transformers 4.57 keeps the keys and values in a DynamicCache, so a wrapper module takes and
returns plain tensors. Its position_ids and attention_mask are inputs so that a caller may pad
the past (masked) and still give the true positions. The script checks the file with ONNX
Runtime against PyTorch.

Image classifiers (1x3x32x32 `pixel_values` to 10 `logits`): ViT (patch 8, 2 layers, hidden
32), ResNet (basic blocks, 2 stages of 1, widths 8 and 16), MobileNetV2 (depth multiplier
0.1, expansion 2, TensorFlow padding) and ConvNeXt (2 stages of 1, widths 8 and 16), written
as `<model>_tiny_opset<N>.onnx` for N = 17, 18, 20:
- opset 17: the legacy exporter (the dynamo exporter writes opset 18 and converts down, which
  fails on ResNet's and ConvNeXt's ReduceMean); MobileNetV2's TensorFlow padding comes out as
  a Pad whose pads are computed from constants (ConstantOfShape, Concat, Slice, Transpose).
- opsets 18 and 20: the dynamo exporter (at 20 it writes Gelu for ViT's and ConvNeXt's
  activation); its per-node metadata (source locations) is dropped to keep the files small.
Weight scales are raised above Hugging Face's initializer ranges (and BatchNorm statistics
drawn at random) so that the logits vary with the pixels instead of vanishing.

Rerun, the script rewrites bert_tiny.onnx, gpt2_tiny_past.onnx and the image classifiers byte
for byte; gpt2_tiny keeps its graph and weights but not its node metadata, which holds this
script's line numbers. tests/frontend/test_hf_fixtures.py imports and runs them (and
tests/serve/test_onnx_decoder.py generates with gpt2_tiny_past); neither torch nor
transformers is needed there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import torch
from transformers import (
    BertConfig,
    BertModel,
    ConvNextConfig,
    ConvNextForImageClassification,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    MobileNetV2Config,
    MobileNetV2ForImageClassification,
    ResNetConfig,
    ResNetForImageClassification,
    ViTConfig,
    ViTForImageClassification,
)

TOKENS, VOCAB = 16, 100
IMAGE, CLASSES, OPSETS = 32, 10, (17, 18, 20)


class Logits(torch.nn.Module):
    """The model's first output tensor, from input_ids alone."""

    def __init__(self, model: torch.nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids), self.field)


class MaskedLogits(torch.nn.Module):
    """The model's first output tensor, from input_ids and an attention_mask."""

    def __init__(self, model: torch.nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        return getattr(out, self.field)


class PastDecoder(torch.nn.Module):
    """A causal language model's step with plain tensors for its cache: (input_ids,
    attention_mask, position_ids, key and value of each layer) to (logits, presents)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cache = DynamicCache()
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        presents = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *presents)


class Classify(torch.nn.Module):
    """An image classifier's logits, from pixel_values alone."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


def vision_models() -> dict[str, torch.nn.Module]:
    """Each model built under its own seed, so one changes without moving the others."""
    common = dict(num_channels=3, num_labels=CLASSES)
    # MobileNetV2's 52 convs: at 0.3 the logits barely depend on the pixels; at 0.5 they reach
    # 40 and float32 rounding alone puts ONNX Runtime 7e-4 from ONNX's reference.
    build = {
        "vit": lambda: ViTForImageClassification(ViTConfig(
            image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, initializer_range=0.2, **common)),
        "resnet": lambda: ResNetForImageClassification(ResNetConfig(
            embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
            **common)),
        "mobilenetv2": lambda: MobileNetV2ForImageClassification(MobileNetV2Config(
            image_size=IMAGE, depth_multiplier=0.1, expand_ratio=2, min_depth=4,
            divisible_by=4, finegrained_output=False, initializer_range=0.35, **common)),
        "convnext": lambda: ConvNextForImageClassification(ConvNextConfig(
            image_size=IMAGE, patch_size=4, num_stages=2, hidden_sizes=[8, 16],
            depths=[1, 1], layer_scale_init_value=1.0, initializer_range=0.2, **common)),
    }  # fmt: skip
    models = {}
    for seed, (name, make) in enumerate(build.items(), start=1):
        torch.manual_seed(seed)
        models[name] = randomize_batch_norms(make()).eval()
    return models


def randomize_batch_norms(model: torch.nn.Module) -> torch.nn.Module:
    # Fresh BatchNorms are identities (mean 0, variance 1, scale 1, shift 0) once folded.
    for norm in model.modules():
        if isinstance(norm, torch.nn.BatchNorm2d):
            with torch.no_grad():
                norm.running_mean.normal_(0.0, 0.1)
                norm.running_var.uniform_(0.5, 1.5)
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0.0, 0.1)
    return model


def export_vision(name: str, model: torch.nn.Module, opset: int, out: Path) -> None:
    path = out / f"{name}_tiny_opset{opset}.onnx"
    pixels = torch.randn(1, 3, IMAGE, IMAGE)
    names = dict(input_names=["pixel_values"], output_names=["logits"], opset_version=opset)
    if opset == 17:
        torch.onnx.export(Classify(model).eval(), (pixels,), str(path), dynamo=False, **names)
        return
    torch.onnx.export(Classify(model).eval(), (pixels,), str(path), dynamo=True,
                      external_data=False, **names)  # fmt: skip
    proto = onnx.load(path)
    for node in proto.graph.node:
        del node.metadata_props[:]
    onnx.save(proto, path)


def export_dynamic(bert: torch.nn.Module, gpt2: torch.nn.Module, out: Path) -> None:
    """The two language models as users export them, with dynamic axes: BERT (legacy
    exporter, opset 17) from input_ids and attention_mask, both [batch, sequence]; GPT-2
    (dynamo, opset 18) from input_ids [batch, sequence]. Their graphs compute shapes at run
    time (Shape -> Gather -> Concat -> Reshape) from those symbolic dims."""
    ids = torch.randint(0, VOCAB, (2, TOKENS - 3))
    mask = torch.ones_like(ids)
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(MaskedLogits(bert, "last_hidden_state"), (ids, mask),
                      str(out / "bert_tiny_dynamic.onnx"),
                      input_names=["input_ids", "attention_mask"], output_names=["hidden"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "hidden": axes},
                      opset_version=17, dynamo=False)  # fmt: skip
    batch, sequence = torch.export.Dim("batch", max=8), torch.export.Dim("sequence", max=TOKENS)
    path = out / "gpt2_tiny_dynamic.onnx"
    torch.onnx.export(Logits(gpt2, "logits"), (ids,), str(path), input_names=["input_ids"],
                      output_names=["logits"], opset_version=18, dynamo=True,
                      dynamic_shapes={"input_ids": {0: batch, 1: sequence}},
                      external_data=False)  # fmt: skip
    proto = onnx.load(path)
    for node in proto.graph.node:
        del node.metadata_props[:]
    onnx.save(proto, path)


def export_past(out: Path) -> None:
    """GPT-2 with past key/values (module docstring), checked with ONNX Runtime on a past of 5
    tokens, 3 new ones and a mask that hides two of the past."""
    torch.manual_seed(5)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=2 * TOKENS,
                        initializer_range=0.2)  # fmt: skip
    gpt2 = GPT2LMHeadModel(config).eval()
    heads, head_dim = config.n_head, config.n_embd // config.n_head
    batch, past, new = 2, 5, 3
    ids = torch.randint(0, VOCAB, (batch, new))
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    mask[1, :2] = 0
    at = torch.arange(past, past + new).expand(batch, new)
    cache = [torch.randn(batch, heads, past, head_dim) for _ in range(2 * config.n_layer)]
    names = [f"past_key_values.{i}.{kv}" for i in range(config.n_layer) for kv in ("key", "value")]
    presents = [name.replace("past_key_values", "present") for name in names]
    positions = config.n_positions
    dims = {name: torch.export.Dim(name, max=limit) for name, limit in
            (("batch", 8), ("sequence", positions), ("past_sequence", positions),
             ("total_sequence", 2 * positions))}  # fmt: skip
    rows = {0: dims["batch"], 1: dims["sequence"]}
    # in the order of forward's arguments: torch matches them by position around *past
    shapes = {
        "input_ids": rows,
        "attention_mask": {0: dims["batch"], 1: dims["total_sequence"]},
        "position_ids": rows,
        "past": tuple({0: dims["batch"], 2: dims["past_sequence"]} for _ in cache),
    }
    path = out / "gpt2_tiny_past.onnx"
    decoder = PastDecoder(gpt2).eval()
    torch.onnx.export(decoder, (ids, mask, at, *cache), str(path),
                      input_names=["input_ids", "attention_mask", "position_ids", *names],
                      output_names=["logits", *presents], opset_version=18, dynamo=True,
                      dynamic_shapes=shapes, external_data=False)  # fmt: skip
    proto = onnx.load(path)
    for node in proto.graph.node:
        del node.metadata_props[:]
    onnx.save(proto, path)
    try:
        import onnxruntime
    except ImportError:
        return
    with torch.no_grad():
        want = decoder(ids, mask, at, *cache)
    feeds = dict(zip(["input_ids", "attention_mask", "position_ids", *names],
                     [t.numpy() for t in (ids, mask, at, *cache)], strict=True))  # fmt: skip
    got = onnxruntime.InferenceSession(str(path)).run(None, feeds)
    for name, a, b in zip(["logits", *presents], got, want, strict=True):
        assert abs(a - b.numpy()).max() < 1e-5, f"{path}: {name} differs from PyTorch's"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/frontend/fixtures")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    bert = BertModel(BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                intermediate_size=64, vocab_size=VOCAB,
                                max_position_embeddings=TOKENS)).eval()  # fmt: skip
    torch.onnx.export(Logits(bert, "last_hidden_state"), (ids,), str(out / "bert_tiny.onnx"),
                      input_names=["input_ids"], output_names=["hidden"], opset_version=17,
                      dynamo=False)  # fmt: skip
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                      n_positions=TOKENS, use_cache=False)).eval()  # fmt: skip
    torch.onnx.export(Logits(gpt2, "logits"), (ids,), str(out / "gpt2_tiny.onnx"),
                      input_names=["input_ids"], output_names=["logits"], opset_version=18,
                      dynamo=True, external_data=False)  # fmt: skip
    export_dynamic(bert, gpt2, out)
    export_past(out)
    for name, model in vision_models().items():
        for opset in OPSETS:
            export_vision(name, model, opset, out)
    for path in sorted(out.glob("*_tiny*.onnx")):
        print(f"{path} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
