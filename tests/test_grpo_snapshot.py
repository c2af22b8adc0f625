"""The GRPO loss and its gradient on a fixed tiny batch, against a stored snapshot (CS336-style).

The snapshot (tests/snapshots/grpo_loss.json) was made by the loss as it was before the loop was
reshaped into `grpo_update`; the reshaped code must give the same numbers.  Values are float32
results, so they are compared within a relative 1e-4 (kernels differ between CPUs); the clip
fractions count tokens and are compared exactly.  Also here: the loop runs three B-row forwards
per iteration (policy at each of the two updates, the reference once), not five.
"""

import json
from pathlib import Path

import pytest
import torch

from labkit.grpo import core, loop, variants
from labkit.grpo.variants import Variant
from labkit.models import presets, scoring
from labkit.config import TINY

SNAPSHOT = json.loads((Path(__file__).parent / "snapshots" / "grpo_loss.json").read_text())
RTOL = 1e-4


def snapshot_inputs():
    """Two groups of G=2: a random-init policy, another as the reference (so the KL is not 0), old
    log-probs = the policy's own plus seeded noise (so rho != 1 and the clip acts)."""
    torch.manual_seed(0)
    policy = presets.new_tiny_model(seed=3).eval()
    reference = presets.new_tiny_model(seed=4).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(10, 200, (n,), generator=g).tolist() for n in (5, 5, 7, 7)]
    responses = [torch.randint(10, 200, (n,), generator=g).tolist() for n in (3, 6, 4, 2)]
    batch = scoring.make_batch(prompts, responses, pad_id=0)
    with torch.no_grad():
        logp, _ = scoring.response_logprobs(policy, batch)
    noise = 0.3 * torch.randn(logp.shape, generator=g)
    old = (logp + noise) * batch.response_mask
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    return policy, reference, batch, old, advantages


def gradient_summary(policy) -> dict:
    grads = [p.grad.double() for p in policy.parameters() if p.grad is not None]
    return {"grad_norm": float(torch.sqrt(sum((g ** 2).sum() for g in grads))),
            "grad_sum_lm_head": float(policy.lm_head.weight.grad.double().sum()),
            "grad_sum_layer0_q": float(policy.model.layers[0].self_attn.q_proj.weight.grad.double().sum())}


def assert_matches_snapshot(values: dict) -> None:
    for key, expected in SNAPSHOT.items():
        if key.startswith("_"):
            continue
        if key.startswith("clip_ratio"):
            assert values[key] == expected, key
        else:
            assert values[key] == pytest.approx(expected, rel=RTOL), key


def test_the_loss_and_its_gradient_match_the_snapshot():
    policy, reference, batch, old, advantages = snapshot_inputs()
    logp_cur, logits_cur = scoring.response_logprobs(policy, batch, return_logits=True)
    logp_ref, logits_ref = core.reference_scores(reference, batch)
    loss, metrics = core.grpo_loss(variants.LossBatch(logp_cur, logits_cur, logp_ref, logits_ref, mask=batch.response_mask,
                                                      measure_mask=batch.response_mask, G=2, logp_old=old,
                                                      advantages=advantages), variants.resolve(Variant(), TINY))
    loss.backward()
    assert_matches_snapshot({"loss": float(loss.detach()), **metrics, **gradient_summary(policy)})


def test_one_update_reports_the_same_figures_and_moves_the_weights():
    policy, reference, batch, old, advantages = snapshot_inputs()
    before = presets.parameter_digest(policy)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    seen = []
    metrics = core.grpo_update(policy, optimizer, core.Rows.of_rollouts(batch, old, advantages, G=2),
                               core.reference_scores(reference, batch), 1e-3, variants.resolve(Variant(), TINY),
                               TINY.grad_clip, before_step=seen.append)
    assert metrics["learning_rate"] == 1e-3 and optimizer.param_groups[0]["lr"] == 1e-3
    # clip_grad_norm_ returns the norm before clipping: the snapshot's gradient norm
    assert metrics["grad_norm"] == pytest.approx(SNAPSHOT["grad_norm"], rel=RTOL)
    assert_matches_snapshot({**metrics, **{k: SNAPSHOT[k] for k in ("grad_sum_lm_head", "grad_sum_layer0_q")}})
    # before_step saw the update's own forward, detached, before the step changed the weights
    assert len(seen) == 1 and not seen[0].requires_grad and seen[0].shape == batch.response_mask.shape
    assert presets.parameter_digest(policy) != before


def test_an_iteration_runs_three_scoring_forwards(tmp_path, monkeypatch):
    """Per iteration: the policy at each of the 2 updates (the pre-update check uses the first) and
    the reference once; sampling does not go through scoring.response_logits."""
    start = tmp_path / "start.safetensors"
    presets.save_model(presets.new_tiny_model(seed=3), start)
    calls = []
    original = scoring.response_logits

    def counting(model, batch):
        calls.append((id(model), int(batch.input_ids.shape[0])))
        return original(model, batch)

    monkeypatch.setattr(scoring, "response_logits", counting)
    small = TINY.with_overrides(max_new_tokens=4, checkpoint_every=0)  # the curves score with forwards of their own
    loop.run_grpo(small, tmp_path / "run", G=2, iterations=2, start_file=start, progress=False)
    B = small.prompts_per_iteration * 2
    assert [rows for _, rows in calls] == [B] * 6, calls
    models_seen = [m for m, _ in calls]
    policy, reference = models_seen[1], models_seen[0]  # the reference forward comes first in an iteration
    assert policy != reference and models_seen == [reference, policy, policy] * 2
