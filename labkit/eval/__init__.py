"""labkit.eval."""
