"""Cache policies: none, the prefix cache, and bounded replay for sliding-window layers."""
