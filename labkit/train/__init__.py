"""labkit.train."""
