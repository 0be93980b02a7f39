"""server stage."""
