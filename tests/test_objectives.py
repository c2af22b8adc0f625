"""The objectives of labkit.grpo.objectives against hand-worked numbers, against the loop's own clipped
surrogate, and against a second implementation written from the papers' formulas in plain Python
(loss and analytic gradient) on every case of tests/data/objective_cases.json, which the code must
regenerate."""

import json
import math

import pytest
import torch

from labkit.grpo import losses, objectives
from labkit.cli import main as cli_main
from labkit.lab.runs import REPO_ROOT

CASE_FILE = REPO_ROOT / "tests" / "data" / "objective_cases.json"
LOG = math.log


def _loss_and_grad(paper, logp, logp_old, A, mask, **kwargs):
    x = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    loss = objectives.objective_loss(paper, x, torch.tensor(logp_old, dtype=torch.float64),
                                     torch.tensor(A, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64),
                                     **kwargs)
    loss.backward()
    return float(loss.detach()), x.grad.tolist()


# One response of two tokens: old probabilities 0.5 and 0.5, new 0.75 and 0.25, so rho = 1.5 and 0.5; A = 1.
HAND = ([[LOG(0.75), LOG(0.25)]], [[LOG(0.5), LOG(0.5)]], [1.0], [[1.0, 1.0]])


@pytest.mark.parametrize("paper, kwargs, loss, grad", [
    # min(1.5, 1.2) = 1.2 (clipped: no gradient), min(0.5, 0.8) = 0.5 (gradient rho A = 0.5); mean over 2 tokens
    ("grpo", {}, -(1.2 + 0.5) / 2, [0.0, -0.5 / 2]),
    # clip-higher: 1.5 is clipped at 1.28
    ("dapo", {}, -(1.28 + 0.5) / 2, [0.0, -0.5 / 2]),
    # the sum divided by B x max_new_tokens = 1 x 4
    ("dr_grpo", {"max_new_tokens": 4}, -(1.2 + 0.5) / 4, [0.0, -0.5 / 4]),
    # weights min(1.5, 1.28) = 1.28 and 0.5, detached, times A log pi: every token keeps a gradient
    ("cispo", {}, -(1.28 * LOG(0.75) + 0.5 * LOG(0.25)) / 2, [-1.28 / 2, -0.5 / 2]),
    # s = exp(mean(log 1.5, log 0.5)) = sqrt(0.75), below 1 - 3e-4: unclipped, d s / d logp_t = s / 2
    ("gspo", {}, -math.sqrt(0.75), [-math.sqrt(0.75) / 2, -math.sqrt(0.75) / 2]),
])
def test_each_objective_on_a_hand_worked_response(paper, kwargs, loss, grad):
    got_loss, got_grad = _loss_and_grad(paper, *HAND, **kwargs)
    assert got_loss == pytest.approx(loss, rel=1e-14, abs=1e-15)
    assert got_grad[0] == pytest.approx(grad, rel=1e-14, abs=1e-15)


def test_grpo_is_the_loops_clipped_surrogate():
    g = torch.Generator().manual_seed(7)
    mask = torch.tensor([[1.0] * n + [0.0] * (6 - n) for n in (6, 2, 4, 1)], dtype=torch.float64)
    old = -torch.rand(4, 6, dtype=torch.float64, generator=g) * 2 * mask
    cur = (old + 0.3 * torch.randn(4, 6, dtype=torch.float64, generator=g)) * mask
    A = torch.randn(4, dtype=torch.float64, generator=g)
    a, b = cur.clone().requires_grad_(True), cur.clone().requires_grad_(True)
    ours = objectives.objective_loss("grpo", a, old, A, mask)
    loops, _ = losses.clipped_surrogate(b, old, A, mask.bool(), clip_eps=0.2)
    ours.backward()
    loops.backward()
    assert float(ours.detach()) == pytest.approx(float(loops.detach()), rel=1e-12)
    assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=1e-15)


def _paper(case: dict) -> tuple[float, list[list[float]]]:
    """Loss and d loss / d logp from the papers' formulas, one token at a time, in plain Python floats."""
    p, o = case["params"], case["paper"]
    logp, old, A, mask = case["logp"], case["logp_old"], case["advantages"], case["mask"]
    B = len(logp)
    lengths = [sum(row) for row in mask]
    tokens = [[t for t in range(len(row)) if row[t]] for row in mask]
    grad = [[0.0] * len(row) for row in logp]

    def weight(i):  # d aggregate / d (token value of response i)
        reduction = p.get("reduction", "sequence")
        if reduction == "sequence":
            return 1.0 / (B * lengths[i])
        if reduction == "token":
            return 1.0 / sum(lengths)
        return 1.0 / (B * p["max_new_tokens"])

    loss = 0.0
    if o == "gspo":
        for i in range(B):
            s = math.exp(sum(logp[i][t] - old[i][t] for t in tokens[i]) / lengths[i])
            clipped = min(max(s, 1 - p["clip_eps"]), 1 + p["clip_eps_high"])
            loss -= min(s * A[i], clipped * A[i]) / B
            if s * A[i] <= clipped * A[i]:  # the unclipped branch is the min: the gradient flows
                for t in tokens[i]:
                    grad[i][t] = -A[i] * s / lengths[i] / B
    else:
        for i in range(B):
            for t in tokens[i]:
                rho = math.exp(logp[i][t] - old[i][t])
                if o == "cispo":
                    w = min(rho, 1 + p["clip_eps_high"])
                    loss -= weight(i) * w * A[i] * logp[i][t]
                    grad[i][t] = -weight(i) * w * A[i]
                else:
                    clipped = min(max(rho, 1 - p["clip_eps"]), 1 + p["clip_eps_high"])
                    loss -= weight(i) * min(rho * A[i], clipped * A[i])
                    grad[i][t] = -weight(i) * rho * A[i] if rho * A[i] <= clipped * A[i] else 0.0
    if p.get("kl_coef"):
        for i in range(B):
            for t in tokens[i]:
                d = case["logp_ref"][i][t] - logp[i][t]
                loss += p["kl_coef"] * weight(i) * (math.exp(d) - d - 1)
                grad[i][t] += p["kl_coef"] * weight(i) * (1 - math.exp(d))
    return loss, grad


CASES = json.loads(CASE_FILE.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['paper']}-{c['params'].get('reduction', '')}"
                         f"{'-k3' if c['params'].get('kl_coef') else ''}-{c['seed']}")
def test_every_case_is_what_the_papers_formulas_give(case):
    loss, grad = _paper(case)
    assert case["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-15)
    for row, expected in zip(case["grad_logp"], grad):
        assert row == pytest.approx(expected, rel=1e-10, abs=1e-15)


def test_the_case_file_covers_every_paper_and_reduction_with_the_named_fields():
    from labkit.grpo import variants

    settings = {(c["paper"], c["params"].get("reduction")) for c in CASES}
    assert {o for o, _ in settings} == set(objectives.PAPERS)
    assert {a for o, a in settings if o == "grpo"} == set(losses.REDUCTIONS)
    # one list of objectives: each paper is one of the loop's, and the settings use the glossary's names
    assert set(objectives.OBJECTIVE_OF.values()) <= set(variants.OBJECTIVES)
    assert {k for c in CASES for k in c["params"]} <= {"clip_eps", "clip_eps_high", "reduction", "max_new_tokens",
                                                        "kl_coef"}
    for c in CASES:
        assert c["objective"] == objectives.OBJECTIVE_OF[c["paper"]]
        assert {"paper", "objective", "params", "logp", "logp_old", "advantages", "mask", "loss", "grad_logp"} <= set(c)
        lengths = [int(sum(row)) for row in c["mask"]]
        assert 1 in lengths and len(set(lengths)) > 1  # unequal lengths, one single-token response
        assert ("logp_ref" in c) == bool(c["params"].get("kl_coef"))
        clipped_or_zero = sum(1 for row, m in zip(c["grad_logp"], c["mask"]) for g, k in zip(row, m) if k and g == 0)
        if c["objective"] == "grpo" and not c["params"].get("kl_coef"):  # (k3 adds to every token)
            assert 0 < clipped_or_zero < sum(lengths)  # both branches of the clip are exercised
    assert len({(c["paper"], c["params"].get("reduction"), bool(c["params"].get("kl_coef"))) for c in CASES}) * 3 \
        == len(CASES)


def test_the_committed_case_file_is_what_the_code_gives(capsys):
    assert cli_main(["objective-cases", "--check"]) == 0
    assert "24 cases, as labkit.grpo.objectives gives them" in capsys.readouterr().out


@pytest.mark.parametrize("call, message", [
    (lambda: _loss_and_grad("ppo", *HAND), r"paper 'ppo': expected one of"),
    (lambda: _loss_and_grad("dr_grpo", *HAND), r"constant_mean: max_new_tokens must be >= the"),
    (lambda: _loss_and_grad("grpo", *HAND, reduction="mean"), r"reduction 'mean': expected one of"),
    (lambda: _loss_and_grad("grpo", HAND[0], HAND[1], [1.0, 2.0], HAND[3]), r"advantages \(2,\) \(B,\)"),
    (lambda: _loss_and_grad("grpo", HAND[0], HAND[1], HAND[2], [[0.0, 0.0]]), "at least one token"),
    (lambda: _loss_and_grad("grpo", *HAND, kl_coef=0.1), "kl_coef > 0 needs logp_ref"),
])
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
