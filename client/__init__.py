"""client stage."""
