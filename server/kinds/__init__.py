"""server: kinds."""
