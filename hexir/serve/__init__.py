"""LLM serving on compiled modules: greedy generation over a paged KV cache (generate.py)."""
