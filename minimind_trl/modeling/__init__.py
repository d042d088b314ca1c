"""MiniMind as a registered transformers model (filled in by the modeling work)."""
