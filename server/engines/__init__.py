"""server: engines."""
