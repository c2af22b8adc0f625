"""A variant's switches are looked up once, in `labkit.grpo.variants.resolve`, never branched on in place.

The loop calls what `resolve` gave it (a reward, a KL term, an objective's rows and loss term);
no other module may test a switch in an `if`, a conditional expression or a `while`.  The test
reads the source, so a new `if variant.kl == ...` anywhere in labkit fails it with its line.
"""

import ast
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from labkit.grpo import variants
from labkit.grpo.variants import Variant

LABKIT = Path(variants.__file__).parents[1]
SWITCHES = {f.name for f in fields(Variant)} | {"is_protocol"}


def _tests_a_switch(expression: ast.AST) -> bool:
    for node in ast.walk(expression):
        if isinstance(node, ast.Attribute) and node.attr in SWITCHES:
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "variant") or \
                    (isinstance(owner, ast.Attribute) and owner.attr == "variant"):
                return True
    return False


def branches_on_a_variant(source: str) -> list[int]:
    """Lines of `if`, `while` and conditional expressions whose condition reads a variant's switch."""
    tree = ast.parse(source)
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, (ast.If, ast.IfExp, ast.While)) and _tests_a_switch(node.test))


def test_the_guard_sees_a_branch_on_a_switch():
    assert branches_on_a_variant("if variant.kl == 'k3':\n    pass\n") == [1]
    assert branches_on_a_variant("x = 1 if loop.variant.reward == 'random' else 0\n") == [1]
    assert branches_on_a_variant("y = resolve(variant).kl_term\nz = variant.updates_per_iteration or 2\n") == []


def test_no_module_but_variants_branches_on_a_switch():
    found = {}
    for path in sorted(LABKIT.rglob("*.py")):
        if path.name == "variants.py":
            continue
        lines = branches_on_a_variant(path.read_text())
        if lines:
            found[str(path.relative_to(LABKIT))] = lines
    assert found == {}, f"branches on a variant's switch outside labkit.grpo.variants.resolve: {found}"


def test_every_allowed_value_has_its_table_entry():
    assert tuple(variants.REWARD_TABLE) == variants.REWARDS
    assert tuple(variants.KL_TABLE) == variants.KLS
    assert tuple(variants.OBJECTIVE_TABLE) == variants.OBJECTIVES


def _hand_policies(seed: int):
    """Hand-sized current and reference logits (2 rows x 3 prefixes x 5 tokens, float64, the current
    with gradient) and the log-probs of fixed sampled tokens under each."""
    g = torch.Generator().manual_seed(seed)
    logits_cur = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    logits_ref = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    logp_cur = torch.log_softmax(logits_cur, -1).gather(-1, tokens[..., None])[..., 0]
    logp_ref = torch.log_softmax(logits_ref, -1).gather(-1, tokens[..., None])[..., 0]
    return logits_cur, logits_ref, logp_cur, logp_ref


@pytest.mark.parametrize("kl", variants.KLS)
def test_each_kl_term_logs_the_same_two_measures_and_optimises_its_own(kl):
    """Hand-sized logits: the logged exact KL and k3 do not depend on the term optimised."""
    logits_cur, logits_ref, logp_cur, logp_ref = _hand_policies(seed=0)
    mask = torch.ones(2, 3, dtype=torch.bool)
    batch = variants.LossBatch(logp_cur, logits_cur, logp_ref, logits_ref, mask=mask, measure_mask=mask, G=None)
    penalty, exact, k3 = variants.KL_TABLE[kl](batch, reduction="sequence", max_new_tokens=3, block_size=4096)
    p, q = torch.softmax(logits_cur.detach(), -1), torch.softmax(logits_ref, -1)
    expected_exact = (p * (p.log() - q.log())).sum(-1).mean()  # every row has 3 tokens: the mean of 6 prefixes
    log_r = (logp_ref - logp_cur).detach()
    expected_k3 = (log_r.exp() - 1 - log_r).mean()
    assert float(exact.detach()) == pytest.approx(float(expected_exact), rel=1e-12)
    assert float(k3.detach()) == pytest.approx(float(expected_k3), rel=1e-12)
    if kl in ("k1", "k2"):  # the estimator itself, with its gradient: k1 = -log r, k2 = (log r)^2 / 2
        expected = (-log_r).mean() if kl == "k1" else (0.5 * log_r ** 2).mean()
        assert float(penalty.detach()) == pytest.approx(float(expected), rel=1e-12) and penalty.requires_grad
        return
    optimised = {"exact": exact, "k3": k3, "none": None}[kl]
    if optimised is None:
        assert float(penalty.detach()) == 0.0 and not penalty.requires_grad
    else:  # the penalty is the logged measure itself (same reduction here), with its gradient
        assert float(penalty.detach()) == float(optimised) and penalty.requires_grad


def test_resolve_adds_the_length_penalty_only_when_asked():
    from labkit.config import TINY

    assert variants.resolve(Variant(), TINY).optimised_reward is variants.verifier_reward
    assert variants.resolve(Variant(length_penalty=0.5), TINY).optimised_reward is not variants.verifier_reward
    assert variants.resolve(Variant(), TINY).identity == {}
    assert variants.resolve(Variant(kl="none"), TINY).identity == {"variant": Variant(kl="none").to_dict()}


def test_a_learned_reward_needs_its_verifier_passed_in_and_only_it_takes_one():
    from labkit.grpo import core
    from labkit.grpo.loop import PROTOCOL_TASK
    from labkit.models import presets
    from labkit.config import TINY

    tokenizer = presets.load_tiny_tokenizer()
    model, reference = presets.new_tiny_model(0, tokenizer), presets.new_tiny_model(0, tokenizer)
    start = dict(start_label="test", sampler="reference", device="cpu", task=PROTOCOL_TASK)
    with pytest.raises(ValueError, match="reward 'learned' needs the learned verifier: pass learned_verifier="):
        variants.resolve(Variant(reward="learned"), TINY)
    with pytest.raises(ValueError, match="reward 'verifier' takes no learned verifier"):
        variants.resolve(Variant(), TINY, learned_verifier=object())
    loop = core.new_loop(TINY, 2, 1, model, reference, tokenizer, "digest",
                         resolved=variants.resolve(Variant(kl="none"), TINY), **start)
    assert loop.resolved.kl_term.func is variants.no_kl_term and list(loop.generators) == ["generation"]
    assert loop.identity["variant"] == Variant(kl="none").to_dict()
    loop = core.new_loop(TINY, 2, 1, model, reference, tokenizer, "digest",
                         resolved=variants.resolve(Variant(reward="random", random_reward_p=0.5), TINY), **start)
    assert "reward" in loop.generators  # saved in every state


@pytest.mark.parametrize("kl", variants.KLS)
def test_the_logged_measures_ignore_the_losss_reduction(kl):
    """A constant reduction scales the penalty by the responses' lengths / 64; the logged exact KL and k3
    stay the protocol's sequence means, so that runs with any reduction are compared on one measure."""
    logits_cur, logits_ref, logp_cur, logp_ref = _hand_policies(seed=1)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)  # lengths 3 and 1
    batch = variants.LossBatch(logp_cur, logits_cur, logp_ref, logits_ref, mask=mask, measure_mask=mask, G=None)
    base_penalty, base_exact, base_k3 = variants.KL_TABLE[kl](batch, reduction="sequence", max_new_tokens=8,
                                                              block_size=4096)
    penalty, exact, k3 = variants.KL_TABLE[kl](batch, reduction="constant", max_new_tokens=8, block_size=4096)
    assert float(exact) == float(base_exact) and float(k3) == float(base_k3)
    if kl == "exact":  # the penalty is the constant reduction of the same per-prefix values
        values = variants.losses.exact_prefix_kl(logits_cur.detach(), logits_ref, 4096)
        assert float(penalty.detach()) == pytest.approx(float(values[mask].sum()) / (2 * 8), rel=1e-12)


def test_the_guarded_learned_reward_pays_only_schema_valid_answers():
    """Issue 57: chapter 10's proxy paid `{"final": 6}`; the source design's format guard zeroes what is not a
    schema-valid answer, and leaves the proxy's yes/no on the others."""
    from types import SimpleNamespace

    class Proxy:
        def rewards(self, prompts, responses):
            return torch.tensor([1.0, 1.0, 0.0, 1.0]), None  # the proxy says yes to three of four

    verdict = lambda valid: SimpleNamespace(valid=valid)  # noqa: E731
    rollout = SimpleNamespace(prompt_ids=[1], response_ids=[2])
    groups = [SimpleNamespace(rollouts=[rollout] * 2, verdicts=[verdict(True), verdict(False)]),
              SimpleNamespace(rollouts=[rollout] * 2, verdicts=[verdict(True), verdict(True)])]
    assert variants.learned_reward(groups, verifier=Proxy()).tolist() == [[1.0, 1.0], [0.0, 1.0]]
    assert variants.guarded_learned_reward(groups, verifier=Proxy()).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert variants.needs_learned_verifier(Variant(reward="learned_guarded"))
