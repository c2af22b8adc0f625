"""labkit.models."""
