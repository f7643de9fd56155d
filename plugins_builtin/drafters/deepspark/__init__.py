"""deepspark: the draft model with lookups, round depths and rounds chosen by measured rates."""
