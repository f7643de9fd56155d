"""Speculative drafters: n-gram lookup, a draft model, and deepspark."""
