"""labkit.book."""
