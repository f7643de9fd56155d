"""`deepinfer router`: one OpenAI-compatible entry point in front of N deepinfer instances."""
