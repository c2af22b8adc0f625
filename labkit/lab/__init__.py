"""labkit.lab."""
