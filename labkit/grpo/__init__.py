"""labkit.grpo."""
