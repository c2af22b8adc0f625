"""Skill or propensity (issue 56): does a thinking base that never works a chain out still have the skill?

    python -m labkit skill-test [--draws 4]        # -> runs/tiny/skill_test/

Chapter 11's profile gives each base the worked prompt and lets it choose how to answer.  rare_0
answered directly in every one of its test responses, and GRPO from it found nothing to select.  Two
readings fit that: rare_0 lost the skill (its second phase trained it on direct answers to the worked
prompt), or it keeps the skill and never starts it.  The profile cannot tell them apart; this test can:
it starts the working for the base.  The response begins with the first step's left side, written
for it ("41 + 35 = " for the chain 41, +35, ...), and the base continues from there.  A base that has
the skill writes the sums and the answer as the skill base does; one that lost it does not.

Everything else is the profile's: the 200 test chains (`thinking_base.TEST_SEED`, 25 per k = 1 ... 8),
temperature 1, the fast sampler, `worked.score_worked` on the whole response (the forced start is part
of the scored text), and draw seeds of the test's own (`draw_seed`), the same for every base, so that
each base is compared with the skill base chain by chain (`reasoning_report.paired_over_chains`).

Files: `rows.json.gz` (every response: base, k, chain, draw, the forced start, the text, the verdict),
`results.json` (per base: accuracy, steps right, per k; each base against the skill base, paired),
`manifest.json`, FINISHED.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from ..lab.runs import RunFolder, atomic_write_bytes, preset_folder, write_json
from ..lab.skeleton import holding
from ..lab.runtime import code_digests, environment, hashed_seed
from ..task import worked
from ..models import presets, sampling
from ..eval import think_profile
from . import reasoning_report, thinking_base

BASES = ("skill", "rare_0", "rare_2", "control")
"""the bases tested: the skill base (the reference: it works every chain out), the two that rarely or never
do, and the control (trained without working)"""
DRAWS = 4
"""temperature-1 answers per test chain and base"""


def forced_start(chain: worked.Chain) -> str:
    """The first step's left side as a worked answer writes it: "a + b = " or "a - b = " (the movement's sign)."""
    first = chain.movements[0]
    return f"{chain.initial} {'+' if first > 0 else '-'} {abs(first)} = "


def draw_seed(k: int, index: int, draw: int) -> int:
    """The sampling seed of one (k, chain, draw) of the test, the same for every base."""
    return hashed_seed(f"skill-test/{k}/{index}/{draw}")


def sample_forced(model, tokenizer, chains_by_k: dict[int, list[worked.Chain]], draws: int) -> list[dict]:
    """`draws` temperature-1 continuations of every chain's forced start; one row per response, as
    `think_profile.sample_worked`'s rows (its "text" the whole response, the forced start included) with
    "forced" added."""
    if draws < 1:
        raise ValueError(f"draws {draws}: must be at least 1")
    keys = [(k, i, d) for k in sorted(chains_by_k) for i in range(len(chains_by_k[k])) for d in range(draws)]
    starts = [forced_start(chains_by_k[k][i]) for k, i, _ in keys]
    prompts = [think_profile.worked_prompt_ids(tokenizer, chains_by_k[k][i])
               + tokenizer.encode(start, add_special_tokens=False) for (k, i, _), start in zip(keys, starts)]
    rollouts = sampling.get_sampler("fast")(model, tokenizer, prompts, [draw_seed(*key) for key in keys],
                                            max_new_tokens=worked.WORKED_MAX_NEW_TOKENS)
    rows = []
    for (k, i, d), start, r in zip(keys, starts, rollouts):
        chain = chains_by_k[k][i]
        text = start + r.text
        v = worked.score_worked(text, r.finish_reason, chain, r.tokenization_valid)
        rows.append({"k": k, "index": i, "draw": d, "chain": {"initial": chain.initial, "movements": list(chain.movements)},
                     "forced": start, "text": text, "finish_reason": r.finish_reason,
                     "tokenization_valid": r.tokenization_valid, "tokens": len(r.response_ids), "reward": v.reward,
                     "reason": v.reason, "thinks": v.thinks, "steps": len(v.steps), "steps_right": v.steps_right,
                     "category": v.category})
    return rows


def summary(rows: list[dict]) -> dict:
    """A base's accuracy with the working started for it, the share of its responses whose steps are all
    right, and both per k."""
    def rates(part):
        return {"responses": len(part), "accuracy": sum(r["reward"] for r in part) / len(part),
                "steps_right": sum(bool(r["steps_right"]) for r in part) / len(part)}

    return {**rates(rows), "per_k": {str(k): rates([r for r in rows if r["k"] == k]) for k in sorted({r["k"] for r in rows})}}


def default_run_dir(preset: str = "tiny") -> Path:
    return preset_folder(preset, "skill_test")


def run(preset: str = "tiny", *, bases: tuple[str, ...] = BASES, draws: int = DRAWS, chains_per_k: int | None = None,
        out: str | Path | None = None, overwrite: bool = False, model_file=None) -> dict:
    """The test for every base in `bases` (the skill base first: the others are paired against it); returns
    the results.  chains_per_k: default the profile's 25.  model_file(base): the base's model file (default:
    its finished thinking-base folder's, checked against its manifest)."""
    import torch

    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: the thinking bases are the tiny preset's")
    unknown = [b for b in bases if b not in thinking_base.BASES]
    if unknown or not bases or bases[0] != "skill":
        raise ValueError(f"bases {list(bases)}: the skill base first (the reference), then any of {thinking_base.BASES}")
    per_k = thinking_base.PROFILE_CHAINS_PER_K if chains_per_k is None else chains_per_k
    chains = thinking_base.held_out_chains(thinking_base.TEST_SEED, per_k)
    began = time.perf_counter()
    rows_by_base = {}
    with holding(RunFolder(out or default_run_dir(preset)), overwrite) as folder:
        for base in bases:
            path = model_file(base) if model_file is not None else _base_model(preset, base)
            model, tokenizer = presets.load("tiny", state=path, device="cpu")
            model.eval()
            with torch.no_grad():
                rows_by_base[base] = [{"base": base, **r} for r in sample_forced(model, tokenizer, chains, draws)]
        results = {"draws": draws, "chains_per_k": per_k,
                   "bases": {b: summary(rows) for b, rows in rows_by_base.items()},
                   "against_skill": {b: reasoning_report.paired_over_chains(rows_by_base["skill"], rows)
                                     for b, rows in rows_by_base.items() if b != "skill"}}
        atomic_write_bytes(folder / "rows.json.gz", gzip.compress(json.dumps(
            [r for rows in rows_by_base.values() for r in rows], sort_keys=True).encode(), mtime=0))
        write_json(folder / "results.json", results)
        for name in ("rows.json.gz", "results.json"):
            folder.register(name)
        write_json(folder / "manifest.json", {"step": "skill_test", "bases": list(bases), "draws": draws,
                                              "code_sha256": code_digests(), "environment": environment("cpu"),
                                              "seconds": time.perf_counter() - began, "ledger": folder.ledger()})
        folder.mark_finished({"bases": list(bases)})
    return results


def _base_model(preset: str, base: str) -> Path:
    """A finished thinking base's model file, checked against its manifest (missing: `cache fill` rebuilds it)."""
    folder = RunFolder(thinking_base.default_run_dir(preset, base))
    folder.manifest()
    if not (folder / thinking_base.MODEL_FILE).is_file():
        raise FileNotFoundError(f"{folder / thinking_base.MODEL_FILE} is not here: "
                                f"`python -m labkit cache fill --steps thinking --runs {base}` rebuilds it")
    folder.check_file(thinking_base.MODEL_FILE)
    return folder / thinking_base.MODEL_FILE


def is_finished(preset: str = "tiny") -> bool:
    return (default_run_dir(preset) / "FINISHED").is_file()


def read(preset: str = "tiny") -> tuple[dict, list[dict]]:
    """The committed test: (results, rows), each file checked against the digest its manifest recorded."""
    folder = RunFolder(default_run_dir(preset))
    if not is_finished(preset):
        raise FileNotFoundError(f"{folder.path} holds no finished skill test: `python -m labkit skill-test` runs it")
    folder.check_file("results.json")
    folder.check_file("rows.json.gz")
    return (json.loads((folder / "results.json").read_text()),
            json.loads(gzip.decompress((folder / "rows.json.gz").read_bytes())))
