"""Triton kernels and their torch references (no deepinfer imports)."""
