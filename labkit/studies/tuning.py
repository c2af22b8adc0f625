"""Choosing the tiny preset's two learning rates on the VALIDATION split (never the test split).

`python -m labkit tune warm-start --rates 1e-3,2e-3` runs the protocol's warm start (48
updates) from the tiny base at each rate; `python -m labkit tune grpo --rates 1e-5,2e-5`
runs the protocol's full GRPO budget (100 iterations) from the warm start at each rate.
Each trial is a real run in `runs/scratch/tune/` (ignored by git) and is measured the same
way: greedy accuracy on the 200 validation problems, and 4 seeded samples per validation
problem at temperature 1 (per-draw success, valid-JSON share, and the share of those groups
of 4 whose rewards are not all equal: the groups that would give GRPO a signal).  The table
is printed and written as JSON; the rates chosen from it are stated in `labkit/config.py`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..lab.runs import REPO_ROOT, write_json
from ..config import FIXED_SEEDS, TINY, PresetConfig

TUNE_DIR = REPO_ROOT / "runs" / "scratch" / "tune"
VALIDATION_DRAW_SEED = FIXED_SEEDS["tuning_validation_draws"]  # the validation draws' seeds (not the evaluation's)


def validation_profile(config: PresetConfig, state_file: str | Path, draws: int = 4) -> dict:
    """Greedy and sampled quality of one policy on the 200 validation problems.

    Returns {"greedy_accuracy", "greedy_valid_json", "sampled_success", "sampled_valid_json",
    "groups_with_signal", "distinct_greedy_answers"}; the samples are seeded, so the profile
    of one file is reproducible on one machine.
    """
    from ..task import data
    from ..models import presets, sampling, scoring
    from ..task.verifier import score

    statements = data.open_records("statements", "validation", "learning")
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    model, tokenizer = presets.load(config.name, state=state_file)
    prompts = [scoring.build_prompt_ids(tokenizer, s["statement"], config.max_prompt_tokens) for s in statements]
    ids = [s["id"] for s in statements]

    def verdicts(rollouts):
        return [score(r.text, r.finish_reason, labels[r.problem_id]["problem"], r.tokenization_valid) for r in rollouts]

    greedy = verdicts(sampling.sample_fast(model, tokenizer, prompts, greedy=True, problem_ids=ids,
                                           max_new_tokens=config.max_new_tokens))
    generator = torch.Generator().manual_seed(VALIDATION_DRAW_SEED)
    seeds = torch.randint(0, 2**62, (len(prompts) * draws,), generator=generator).tolist()
    sampled = verdicts(sampling.sample_fast(model, tokenizer, [p for p in prompts for _ in range(draws)], seeds,
                                            problem_ids=[i for i in ids for _ in range(draws)],
                                            max_new_tokens=config.max_new_tokens))
    groups = [sampled[i : i + draws] for i in range(0, len(sampled), draws)]
    return {
        "greedy_accuracy": sum(v.reward for v in greedy) / len(greedy),
        "greedy_valid_json": sum(v.valid for v in greedy) / len(greedy),
        "distinct_greedy_answers": len({v.value for v in greedy if v.valid}),
        "sampled_success": sum(v.reward for v in sampled) / len(sampled),
        "sampled_valid_json": sum(v.valid for v in sampled) / len(sampled),
        "groups_with_signal": sum(len({v.reward for v in g}) > 1 for g in groups) / len(groups),
        "problems": len(greedy),
        "draws": draws,
    }


def _trials(key: str, rates: list[float], train, base: PresetConfig = TINY, prefix: str = "") -> list[dict]:
    """One trial per rate: `train(config, run_dir)` runs it; each row adds the validation profile."""
    rows = []
    for rate in rates:
        config = base.with_overrides(**{key: rate})
        run_dir = TUNE_DIR / f"{prefix}{key}-{rate:g}"
        began = time.perf_counter()
        train(config, run_dir)
        rows.append({key: rate, **validation_profile(config, run_dir / "model.safetensors"),
                     "seconds": round(time.perf_counter() - began, 1)})
        print(_row_text(rows[-1]), flush=True)
    return rows


def tune_warm_start(rates: list[float], base_file: str | Path) -> list[dict]:
    """One protocol warm start (48 updates) per rate from `base_file`; the validation profile of each."""
    from ..models import presets
    from ..train import sft

    return _trials("sft_lr", rates, lambda config, run_dir: sft.run_branch(
        config, "warm_start", run_dir, model_factory=lambda: presets.load("tiny", state=base_file),
        start_description=str(base_file), overwrite=True, progress=False, greedy_eval=False))


def tune_grpo(rates: list[float], warm_file: str | Path) -> list[dict]:
    """One protocol GRPO run (100 iterations) per rate from `warm_file`; the validation profile of each."""
    from ..grpo import loop

    return _trials("grpo_lr", rates, lambda config, run_dir: loop.run_grpo(
        config, run_dir, start_file=warm_file, overwrite=True, progress=False))


def tune_grpo_large(rates: list[float], warm_file: str | Path) -> list[dict]:
    """One larger run (labkit.studies.larger_run: 32 prompts x G=8, 100 iterations) per rate from `warm_file`;
    the validation profile of each, and its fixed-prompt curve's last exact KL."""
    from ..grpo import loop
    from . import larger_run

    def train(config, run_dir):
        loop.run_grpo(config, run_dir, start_file=warm_file, overwrite=True, progress=False,
                      sampler=larger_run.SAMPLER, shared_prompts=True)

    rows = _trials("grpo_lr", rates, train, base=larger_run.larger_config("tiny"), prefix="large-")
    for row in rows:
        curve = loop.read_checkpoints(TUNE_DIR / f"large-grpo_lr-{row['grpo_lr']:g}")
        row["final_kl"] = curve[-1]["kl"] if curve else None
    return rows


def _row_text(row: dict) -> str:
    rate = {k: v for k, v in row.items() if k.endswith("_lr")}
    return (f"{rate}: greedy {row['greedy_accuracy']:.1%} (valid JSON {row['greedy_valid_json']:.0%}, "
            f"{row['distinct_greedy_answers']} distinct), sampled {row['sampled_success']:.1%} per draw "
            f"(valid JSON {row['sampled_valid_json']:.1%}), groups with signal {row['groups_with_signal']:.0%}, "
            f"{row['seconds']} s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("warm-start", "grpo", "grpo-large"),
                        help="which rate to try (grpo-large: the larger run's, labkit.studies.larger_run)")
    parser.add_argument("--rates", required=True, help="comma-separated learning rates, e.g. 1e-3,2e-3")
    parser.add_argument("--start", type=Path, default=None,
                        help="starting model (default: runs/tiny/base for warm-start, runs/tiny/warm_start for grpo)")
    parser.add_argument("--out", type=Path, default=None, help="JSON table to write (default: runs/scratch/tune/<what>.json)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """The `tune` command: one trial per rate, then the table."""
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        raise SystemExit(f"--rates {args.rates!r}: expected comma-separated numbers, e.g. 1e-3,2e-3")
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit(f"--rates {args.rates!r}: every rate must be positive")
    if args.threads < 1:
        raise SystemExit(f"--threads {args.threads}: must be at least 1")
    torch.set_num_threads(args.threads)
    runs = REPO_ROOT / "runs" / "tiny"
    if args.what == "warm-start":
        start = args.start or runs / "base" / "model.safetensors"
        rows = tune_warm_start(rates, start)
    else:
        start = args.start or runs / "warm_start" / "model.safetensors"
        rows = (tune_grpo if args.what == "grpo" else tune_grpo_large)(rates, start)
    out = args.out or TUNE_DIR / f"{args.what}.json"
    write_json(out, {"what": args.what, "start": str(start), "split": "validation", "rows": rows})
    print(f"wrote {out}")
    return 0
