"""Attention backends: the torch reference, Triton kernels, Ascend operators."""
