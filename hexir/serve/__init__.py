"""LLM serving on compiled modules: greedy generation over a paged KV cache (generate.py), and
the float64 numpy GPT-2 its token ids are checked against (reference.py)."""
