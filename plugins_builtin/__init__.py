"""deepinfer's built-in plugins, written against the public plugin API only."""
