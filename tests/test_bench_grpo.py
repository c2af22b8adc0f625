"""`python -m labkit bench grpo --quick` runs end to end (the smoke `make test` asks for).

Its times are printed, never asserted; what is asserted is what the benchmark claims beside
them: the static sampler's tokens equal the reference sampler's, the shared-prompt path's
log-probs equal the plain path's within the protocol's tolerance (2e-4) and keep less for the backward pass,
and one iteration's parts add up to its total.
"""

import pytest
import torch

from labkit.bench import grpo as bench


@pytest.fixture(scope="module")
def report():
    return bench.run(["--quick"])


def test_the_static_sampler_agrees_with_the_reference_in_both_cases(report):
    for case in report["sampling"].values():
        assert case["static_identical"] == case["rollouts"] == 16
        assert set(case["seconds"]) == {"reference", "fast", "static", "generate()"}
        assert all(s > 0 for s in case["seconds"].values())


def test_shared_prompt_updates_agree_and_keep_less_for_backward(report):
    (G, updates), = report["updates"].items()
    assert G == 4 and updates["max_abs_logp_diff"] <= 2e-4  # the protocol's log-prob tolerance
    assert updates["saved_bytes"]["shared"] < updates["saved_bytes"]["plain"]
    assert updates["token_bound"] > 1


def test_the_floor_counts_the_tiny_models_multiply_adds(report):
    # 4 layers x (q 128x128 + k, v 128x64 each + o 128x128 + MLP 3 x 128x512) + head 512x128,
    # plus attention: 2 x 4 layers x 4 heads x 32 x 72 positions
    per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 512
    assert report["floor"]["macs_per_token"] == 4 * per_layer + 512 * 128 + 2 * 4 * 4 * 32 * 72


def test_an_iterations_parts_add_up_to_its_total(report):
    assert len(report["iteration"]) == 3
    for parts in report["iteration"].values():
        assert sum(parts[k] for k in ("generation", "reference", "updates", "check", "bookkeeping")) \
            == pytest.approx(parts["total"], rel=1e-9)
        assert min(parts[k] for k in ("generation", "reference", "updates")) > 0


def test_a_worked_iterations_update_by_both_paths_agrees_and_is_timed_stage_by_stage(monkeypatch, capsys):
    """Section 5's comparison (`bench.bench_worked_iteration`) on a small worked loop from the warm start: the same
    rollouts updated from the same state by today's path (plain, padded) and the bucketed one; their losses and
    first gradients agree to float32 rounding (test_shared_prompt.py's bounds), every stage is timed."""
    from labkit.config import ReasoningConfig
    from labkit.lab.runs import REPO_ROOT
    from labkit.studies import reasoning, thinking_base

    monkeypatch.setattr(thinking_base, "MEASURE_CHAINS_PER_K", 1)
    monkeypatch.setattr(thinking_base, "PROFILE_CHAINS_PER_K", 1)
    cfg = ReasoningConfig(prompts_per_iteration=2, G=4, iterations=1, train_chains_per_k=4)
    loop = reasoning.new_loop(reasoning.get_run("from_rare_2"), cfg,
                              REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors")
    before = {k: v.clone() for k, v in loop.model.state_dict().items()}
    out = bench.bench_worked_iteration(loop, repeats=1, peak_flops=1e10)
    assert out["loss_diff"] <= 2e-4 and out["grad_diff"] <= 5e-4 and out["same_rollouts"]
    for path in bench.UPDATE_PATHS:
        stages = out[path]["stages"]
        assert set(stages) == {"batch", "reference forward", "policy forward", "loss", "backward", "step"}
        assert out[path]["update_s"] == pytest.approx(sum(stages.values()))
    assert all((loop.model.state_dict()[k] == v).all() for k, v in before.items())  # the loop's state put back
    printed = capsys.readouterr().out
    assert "a worked iteration: today" in printed
    # two threads (where there are two cores): reported, with whether its rollouts are one thread's (a CPU may
    # split a product's sums otherwise at two threads: the skill base's 128 worked answers differed on a quiet
    # 2-core EPYC, 2026-12-07), the losses to float32 rounding where they are; one thread after
    assert torch.get_num_threads() == 1
    if out["threads"] is not None:
        assert isinstance(out["threads"]["same_rollouts"], bool)
        assert not out["threads"]["same_rollouts"] or out["threads"]["loss_diff"] <= 2e-4
        assert f"at {out['threads']['threads']} threads, as on a two-core laptop" in printed
        assert f"(the same rollouts: {out['threads']['same_rollouts']};" in printed
