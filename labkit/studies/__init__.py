"""labkit.studies."""
