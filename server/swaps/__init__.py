"""server: swaps."""
