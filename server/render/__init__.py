"""server: render."""
