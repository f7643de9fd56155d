"""Schedulers: first come, first served continuous batching."""
