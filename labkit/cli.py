"""`python -m labkit ...`: every step of the protocol, one sub-command each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_data(args: argparse.Namespace) -> int:
    """Generate StockArithmetic-v1 from its seed (or check the committed files)."""
    import tempfile

    from . import data, task
    from .runs import sha256_file

    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = data.write_dataset(Path(tmp), seed=args.seed)
            bad = [p.name for p in fresh if not (data.DATA_DIR / p.name).exists()
                   or sha256_file(p) != sha256_file(data.DATA_DIR / p.name)]
        if bad:
            print(f"committed data differs from seed {args.seed}: {bad}", file=sys.stderr)
            return 1
        print(f"committed data reproduces byte for byte from seed {args.seed}")
        return 0
    for p in data.write_dataset(seed=args.seed):
        print(p.relative_to(data.DATA_DIR.parent.parent))
    return 0


BENCHMARKS = {
    "kl": "blocked exact KL against a naive log_softmax + kl_div (time and memory ratios)",
    "sampling": "fast KV-cache sampler against the reference sampler on one GRPO iteration",
}


def cmd_bench(args: argparse.Namespace) -> int:
    """Run one benchmark; each prints its ratios, measured in one process."""
    import importlib

    module = importlib.import_module(f"labkit.bench.{args.name}")
    return module.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m labkit",
        description="GRPO course lab: run each step of the protocol (see book/protocol.md).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    from .task import DEFAULT_SEED

    p = sub.add_parser("data", help="generate the StockArithmetic-v1 files from their seed")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="generation seed (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="only check that the committed files reproduce byte for byte")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("bench", help="run a benchmark that prints ratios measured in one process")
    p.add_argument("name", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(func=cmd_bench)

    # Further sub-commands are added below, one block each, in protocol order.
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
