"""server: http."""
