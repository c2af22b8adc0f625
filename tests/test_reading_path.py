"""The GRPO core reads in one sitting: one iteration's path, counted with its data types and the log-prob
gather, is at most 800 lines in at most 4 files, and
the clipped surrogate is at most 4 calls below `run_iteration` (tests/reading_path.py says how it is
measured, and `python tests/reading_path.py` prints the path in reading order)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import reading_path  # noqa: E402

RESULT = reading_path.measure()


def test_the_path_starts_at_run_iteration_and_reaches_the_objective_and_the_exact_kl():
    names = {(f.module, f.name) for f in RESULT["functions"]}
    assert RESULT["functions"][0].name == "run_iteration"
    for key in [("labkit.grpo.core", "sample_iteration"), ("labkit.grpo.core", "update_iteration"),
                ("labkit.grpo.core", "grpo_loss"), ("labkit.grpo.losses", "clipped_surrogate"),
                ("labkit.grpo.losses", "group_advantages"), ("labkit.grpo.losses", "exact_prefix_kl"),
                ("labkit.grpo.losses", "_ExactPrefixKL.backward")]:
        assert key in names, key


def test_one_iteration_with_its_data_types_and_the_gather_reads_in_at_most_800_lines_across_at_most_4_files():
    assert RESULT["lines"] <= 800 and len(RESULT["files"]) <= 4, (RESULT["lines"], RESULT["files"])
    assert {t.name for t in RESULT["types"]} >= {"Loop", "Sampled", "Rows", "LossBatch", "Resolved"}
    assert [f.name for f in RESULT["gather"]][0] == "response_logprobs"


def test_the_clipped_surrogate_is_at_most_4_calls_below_run_iteration():
    assert RESULT["target_depth"] is not None and RESULT["target_depth"] <= 4


def test_the_walk_follows_the_resolved_variant_and_stops_at_the_units_below():
    """The protocol's reward is reached through `loop.resolved`; the sampler and the update step are below
    GRPO, read by their docstrings; the log-prob gather is read whole."""
    boundary = {name for _, name in RESULT["boundary"]}
    assert {"clipped_step", "sample_groups"} <= boundary and "response_logprobs" not in boundary
    assert ("labkit.grpo.variants", "verifier_reward") in {(f.module, f.name) for f in RESULT["functions"]}
