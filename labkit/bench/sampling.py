"""Benchmark: the fast KV-cache sampler against the reference sampler on one GRPO iteration.

One GRPO iteration samples 16 rollouts: 4 train prompts x 4 seeds, temperature 1,
at most 64 new tokens.  Both samplers produce them in the same process on the
tiny preset (the committed base if it exists, else a random-init tiny model,
said so in the output); the benchmark reports their times, whether they gave
the same tokens (and why not, where not), and ends with `speedup: N.Nx`.

    python -m labkit bench sampling [--max-new-tokens 64] [--threads N]
"""

from __future__ import annotations

import argparse

import torch

from ..models import scoring
from ..models.sampling import sample_fast, sample_reference
from ..eval.agreement import compare_samplers

__all__ = ["compare_samplers", "load_bench_model", "main"]

PROMPTS, SEEDS_PER_PROMPT = 4, 4  # one GRPO iteration: 4 prompts x G = 4


def load_bench_model():
    """(model, tokenizer, description): the committed tiny base, else a random-init tiny model."""
    from ..models import presets

    if presets.TINY_BASE_STATE.is_file():
        model, tokenizer = presets.load("tiny", device="cpu")
        return model, tokenizer, f"tiny base ({presets.TINY_BASE_STATE.relative_to(presets.REPO_ROOT)})"
    from ..models.tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    model = presets.new_tiny_model(seed=0, tokenizer=tokenizer)
    return model, tokenizer, (
        f"RANDOM-INIT tiny model (seed 0): no committed base at "
        f"{presets.TINY_BASE_STATE.relative_to(presets.REPO_ROOT)}"
    )


def bench_prompts(tokenizer, count: int = PROMPTS) -> tuple[list[str], list[list[int]]]:
    """The first `count` prompts of the RL pool (train problems after the 128 warm-start ones)."""
    from ..task.data import open_records
    from ..task.problems import WARM_START_SIZE

    records = open_records("statements", "train", "learning")[WARM_START_SIZE:WARM_START_SIZE + count]
    return [r["id"] for r in records], [scoring.build_prompt_ids(tokenizer, r["statement"]) for r in records]


def _print_agreement(name: str, result: dict) -> None:
    print(f"{name} agreement: {result['identical']}/{result['rollouts']} rollouts identical, "
          f"{result['mismatching']} mismatching; common-prefix tokens {result['tokens_equal']}/{result['tokens_compared']}")
    for m in result["mismatches"]:
        print(f"  mismatch {m['rollout_id']}: first differing step {m['first_differing_step']}, "
              f"reference token {m.get('reference_token')} vs fast {m.get('fast_token')}, "
              f"top-2 gap of the decision score there {m.get('top2_gap', float('nan')):.3g}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit bench sampling", description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=scoring.MAX_NEW_TOKENS,
                        help="response limit (default: %(default)s, the protocol's)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    model, tokenizer, description = load_bench_model()
    problem_ids, prompts = bench_prompts(tokenizer)
    print(f"model: {description}")
    print(f"rollouts: {PROMPTS * SEEDS_PER_PROMPT} ({PROMPTS} prompts x {SEEDS_PER_PROMPT} seeds), temperature 1, "
          f"at most {args.max_new_tokens} new tokens, {torch.get_num_threads()} torch threads, "
          f"device {next(model.parameters()).device}")

    # Warm-up: first calls pay one-off costs (allocations, lazy initialisation) that are not sampling.
    for sampler in (sample_reference, sample_fast):
        sampler(model, tokenizer, prompts[:1], [0], max_new_tokens=2, policy_digest="warm-up")

    seeded = compare_samplers(model, tokenizer, prompts, SEEDS_PER_PROMPT, greedy=False,
                              max_new_tokens=args.max_new_tokens, problem_ids=problem_ids)
    for name, key, tokens in (("reference (sequential, no KV cache)", "reference_seconds", "reference_tokens"),
                              ("fast (batched, KV cache)", "fast_seconds", "fast_tokens")):
        print(f"{name}: {seeded[key]:.3f} s for {seeded[tokens]} tokens "
              f"({seeded[tokens] / seeded[key]:.0f} tokens/s)")
    _print_agreement("seeded", seeded)
    greedy = compare_samplers(model, tokenizer, prompts, None, greedy=True,
                              max_new_tokens=args.max_new_tokens, problem_ids=problem_ids)
    _print_agreement("greedy", greedy)
    print(f"speedup: {seeded['speedup']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
