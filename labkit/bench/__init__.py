"""Benchmarks: one module per measured claim, each with `main(argv=None) -> int` (run as `python -m labkit bench NAME`)."""
