"""Export tiny Hugging Face language models that take token ids to ONNX, as test fixtures.

    pip install torch==2.13.0 "transformers==4.57.*" onnx onnxscript   # not Hexir's deps
    python scripts/export_hf_fixtures.py [OUT_DIR]    # default tests/frontend/fixtures

Random weights (seeded), tiny configurations (2 layers, hidden 32, vocab 100, 16 tokens), so
each file is a few hundred KB: BERT through PyTorch's legacy (TorchScript) exporter at opset
17 (it writes ConstantOfShape for the attention mask), GPT-2 through the dynamo exporter at
opset 18 (IsNaN around the attention's softmax; the legacy exporter fails on GPT-2 with
transformers 4.57). Both start with an embedding lookup of `input_ids`: a Gather whose indices
are a graph input. tests/frontend/test_hf_fixtures.py imports and runs them; neither torch
nor transformers is needed there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

TOKENS, VOCAB = 16, 100


class Logits(torch.nn.Module):
    """The model's first output tensor, from input_ids alone."""

    def __init__(self, model: torch.nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids), self.field)


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
    for path in sorted(out.glob("*_tiny.onnx")):
        print(f"{path} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
