"""server: sharing."""
