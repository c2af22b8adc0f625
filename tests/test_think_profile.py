"""The think profile (labkit.eval.think_profile, issue 41): counted by hand, and sampled reproducibly."""

import pytest

from labkit.models import presets
from labkit.eval import think_profile
from labkit.task import worked
from labkit.task.worked import Chain


def _row(k, reward, thinks, steps=0, tokens=10, category="direct"):
    return {"k": k, "reward": reward, "thinks": thinks, "steps": steps, "tokens": tokens, "category": category}


def test_the_profile_by_hand():
    rows = [_row(1, 1, True, 1, 12, "correct"), _row(1, 0, True, 3, 20, "wrong_step"), _row(1, 1, False),
            _row(1, 0, False, category="malformed"), _row(2, 0, False)]
    p = think_profile.profile(rows)
    assert p[1] == {"responses": 4, "think_rate": 0.5, "accuracy": 0.5, "thinking": 2, "accuracy_thinking": 0.5,
                    "direct": 2, "accuracy_direct": 0.5, "mean_steps": 2.0, "mean_tokens": 13.0,
                    "categories": {"correct": 1, "wrong_step": 1, "direct": 1, "malformed": 1}}
    assert p[2]["think_rate"] == 0.0 and p[2]["accuracy_thinking"] is None and p[2]["mean_steps"] is None


def test_worked_samples_are_seeded_scored_and_reproducible():
    tokenizer = presets.load_tiny_tokenizer()
    model = presets.new_tiny_model(0, tokenizer)
    chains = {1: [Chain(5, (3,))], 3: [Chain(10, (4, -2, 7))]}
    a = think_profile.sample_worked(model, tokenizer, chains, draws=2, seed=1, max_new_tokens=6)
    b = think_profile.sample_worked(model, tokenizer, chains, draws=2, seed=1, max_new_tokens=6)
    assert a == b and len(a) == 4 and [(r["k"], r["draw"]) for r in a] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    for r in a:  # every row is the worked verifier's verdict on its own text
        chain = Chain(r["chain"]["initial"], tuple(r["chain"]["movements"]))
        v = worked.score_worked(r["text"], r["finish_reason"], chain, r["tokenization_valid"])
        assert (r["reward"], r["reason"], r["category"]) == (v.reward, v.reason, v.category)
    prompt = tokenizer.decode(think_profile.worked_prompt_ids(tokenizer, chains[3][0]))
    assert "opening stock 10; delivery +4; withdrawal -2; delivery +7" in prompt and worked.WORKED_INSTRUCTION in prompt
    with pytest.raises(ValueError, match="draws must be at least 1"):
        think_profile.sample_worked(model, tokenizer, chains, draws=0, seed=1)
