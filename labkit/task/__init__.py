"""labkit.task."""
