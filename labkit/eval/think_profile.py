"""The think profile (issue 41): per number of movements k, how often a policy works the problem out
before it answers, and how often it is right when it does and when it does not.

The source design's `think_profile` reports, per difficulty: the share of responses that think,
accuracy overall, accuracy of the thinking responses and of the direct ones, and the chain's length.
Here a problem is a `labkit.task.worked.Chain` of k movements, the prompt asks for worked answers
(`worked.WORKED_INSTRUCTION`), and each response is scored by `worked.score_worked`.

    rows = sample_worked(model, tokenizer, {k: worked.fresh_chains(k, 25, seed) for k in range(1, 9)},
                         draws=4, seed=0)
    table = profile(rows)        # {k: {"responses", "think_rate", "accuracy", ...}}

Sampling is seeded per (k, chain, draw), so a profile is reproducible and two policies can be
compared on the same chains and seeds (paired).
"""

from __future__ import annotations

from collections import Counter

from ..lab.runtime import hashed_seed
from ..task import worked
from ..task.worked import Chain
from ..models import sampling

ITEM = "boxes"


def worked_prompt_ids(tokenizer, chain: Chain, item: str = ITEM) -> list[int]:
    """The chat prompt of one chain: its statement and the worked instruction (user turn + assistant header)."""
    messages = [{"role": "user", "content": chain.statement(item) + "\n" + worked.WORKED_INSTRUCTION}]
    return [int(i) for i in tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                          return_dict=False)]


def draw_seed(seed: int, k: int, index: int, draw: int) -> int:
    """The sampling seed of one (k, chain, draw): `runtime.hashed_seed` of its name."""
    return hashed_seed(f"think/{seed}/{k}/{index}/{draw}")


def sample_worked(model, tokenizer, chains_by_k: dict[int, list[Chain]], draws: int, seed: int,
                  sampler: str = "fast", max_new_tokens: int = worked.WORKED_MAX_NEW_TOKENS) -> list[dict]:
    """`draws` seeded samples (temperature 1) of every chain; one row per response:
    {"k", "index", "draw", "chain" {"initial", "movements"}, "text", "finish_reason", "tokenization_valid",
    "tokens", "reward",
    "reason", "thinks", "steps", "steps_right", "category"}."""
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    keys = [(k, i, d) for k in sorted(chains_by_k) for i in range(len(chains_by_k[k])) for d in range(draws)]
    prompts = [worked_prompt_ids(tokenizer, chains_by_k[k][i]) for k, i, _ in keys]
    rollouts = sampling.get_sampler(sampler)(model, tokenizer, prompts, [draw_seed(seed, *key) for key in keys],
                                             max_new_tokens=max_new_tokens)
    rows = []
    for (k, i, d), r in zip(keys, rollouts):
        chain = chains_by_k[k][i]
        v = worked.score_worked(r.text, r.finish_reason, chain, r.tokenization_valid)
        rows.append({"k": k, "index": i, "draw": d,
                     "chain": {"initial": chain.initial, "movements": list(chain.movements)},
                     "text": r.text, "finish_reason": r.finish_reason, "tokenization_valid": r.tokenization_valid,
                     "tokens": len(r.response_ids),
                     "reward": v.reward, "reason": v.reason, "thinks": v.thinks, "steps": len(v.steps),
                     "steps_right": v.steps_right, "category": v.category})
    return rows


def _rate(hits: int, n: int) -> float | None:
    return hits / n if n else None


def profile(rows: list[dict]) -> dict[int, dict]:
    """Per k: {"responses", "think_rate", "accuracy", "thinking", "accuracy_thinking", "direct",
    "accuracy_direct", "mean_steps" (of the thinking responses), "mean_tokens", "categories"};
    an accuracy over no response is None."""
    out = {}
    for k in sorted({r["k"] for r in rows}):
        part = [r for r in rows if r["k"] == k]
        thinking = [r for r in part if r["thinks"]]
        direct = [r for r in part if not r["thinks"]]
        out[k] = {"responses": len(part), "think_rate": len(thinking) / len(part),
                  "accuracy": sum(r["reward"] for r in part) / len(part),
                  "thinking": len(thinking), "accuracy_thinking": _rate(sum(r["reward"] for r in thinking), len(thinking)),
                  "direct": len(direct), "accuracy_direct": _rate(sum(r["reward"] for r in direct), len(direct)),
                  "mean_steps": _rate(sum(r["steps"] for r in thinking), len(thinking)),
                  "mean_tokens": sum(r["tokens"] for r in part) / len(part),
                  "categories": dict(Counter(r["category"] for r in part))}
    return out
