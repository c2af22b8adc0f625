"""Chapter 8, the group-size exercise: G=2 and G=8 trained from the warm start
(book/protocol.md, "Evaluation and the group-size exercise").

In the order of the chapter:

    1. constant groups        CONSTRUCTED rewards [0,0,0,0], [1,1,1,1], [1,0,1,0] (not model
                              outputs): advantages, surrogate value, gradient per token
    2. the branches           G=2 and G=8, 20 iterations each, the main run's loop and start
    3. same presentations     the 80 prompt presentations of both branches, checked equal (and
                              equal to the first 80 of the main G=4 run when it exists)
    4. budget, zero signal    updates, presentations, rollouts, tokens, seconds per branch; the
                              measured zero-variance fraction against p^G + (1-p)^G
    5. protection             SHA-256 of the main weights, results and configuration, recorded
                              before the exercise and checked unchanged after it
    6. diagnose-this          a bonus added to the verifier's reward to force a curve is refused
    7. the whole exercise     `run_exercise` = `python -m labkit group-size`

Run folders: runs/<preset>/grpo_g2 and grpo_g8 (ordinary GRPO runs, each with its
resume report) and runs/<preset>/group_size/ (zero_variance_groups.json, presentations.json,
warm_start_p.json, budget.json, protection_before.json, protection.json, manifest.json).
Nothing here writes into the main runs; the protection check proves it.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..lab.runs import (REPO_ROOT, RunExistsError, display_path, dumps_json, is_finished, mark_finished, preset_folder,
                   read_json, sha256_bytes, sha256_file, write_json)
from ..config import QWEN, SEED_OFFSETS, PresetConfig, get_preset
from ..grpo import core, loop, losses
from ..grpo.losses import expected_frac_reward_zero_std

BRANCH_GROUP_SIZES = (2, 8)
BRANCH_ITERATIONS = 20
RESUME_STOP_AT = 8  # the branches' resume boundary: stop after iteration 8 of 20
MAIN_POLICIES = ("warm_start", "sft", "grpo")
MAIN_GROUP_SIZE = QWEN.G  # the main run's G: every preset's config.G
# Seeds of the warm start's validation draws (the p of section 4), apart from every other stream.
VALIDATION_DRAW_SEED_OFFSET = SEED_OFFSETS["group_size_validation_draws"]


def runs_root_of(preset: str) -> Path:
    return preset_folder(preset)


def branch_dir(runs_root: str | Path, G: int) -> Path:
    """runs/<preset>/grpo_g<G> (grpo for G=4, the main run), as `grpo.default_run_dir` names them (the
    name depends on G alone: every preset's G is 4)."""
    return Path(runs_root) / loop.default_run_dir(QWEN.name, G).name


# -- 1. Constant groups, with constructed rewards --------------------------------------------

CONSTRUCTED = "constructed rewards and log-probs for teaching, NOT model outputs"
CONSTANT_GROUP_CASES = (
    ("all wrong", (0.0, 0.0, 0.0, 0.0)),
    ("all right", (1.0, 1.0, 1.0, 1.0)),
    ("two right, two wrong", (1.0, 0.0, 1.0, 0.0)),
)
# Constructed log-probs of 4 responses of 3, 2, 3 and 1 tokens (padding is masked): the
# unequal lengths show that a response weighs 1/G in all, spread over its own tokens.
CONSTRUCTED_PROBS = ((0.6, 0.3, 0.9), (0.2, 0.5, 1.0), (0.8, 0.4, 0.1), (0.5, 1.0, 1.0))
CONSTRUCTED_LENGTHS = (3, 2, 3, 1)


def constructed_logprobs() -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, mask), both (4, 3): float64 log-probs of constructed tokens and the response mask."""
    logp = torch.tensor(CONSTRUCTED_PROBS, dtype=torch.float64).log()
    mask = torch.arange(3)[None, :] < torch.tensor(CONSTRUCTED_LENGTHS)[:, None]
    return logp, mask


def constant_group_case(rewards, clip_eps: float = 0.2, eps: float = 1e-8) -> dict:
    """Advantages, surrogate loss and d loss / d logp_cur for one constructed group of 4.

    rewards: 4 numbers (one group).  logp_old = logp_cur (detached copy), so rho = 1 on
    every token and the clip is inactive.  The gradient on token t of response i is then

        d loss / d logp_cur_it = - A_i / (G L_i)      (L_i = the response's active tokens)

    and 0 on padding: exactly zero for a constant group, whose advantages are exactly 0.
    """
    r = torch.tensor([list(rewards)], dtype=torch.float64)  # (1, G)
    G = r.shape[1]
    logp, mask = constructed_logprobs()
    if G != logp.shape[0]:
        raise ValueError(f"the constructed log-probs hold {logp.shape[0]} responses; got a group of {G} rewards")
    advantages = losses.group_advantages(r, eps=eps)[0]  # (G,)
    logp_cur = logp.clone().requires_grad_(True)  # (G, T)
    loss, stats = losses.clipped_surrogate(logp_cur, logp.detach().clone(), advantages, mask,
                                           clip_eps=clip_eps, G=G)
    loss.backward()
    lengths = mask.sum(dim=1, keepdim=True).to(torch.float64)  # (G, 1)
    expected = torch.where(mask, -advantages[:, None] / (G * lengths), torch.zeros_like(logp))
    return {
        "source": CONSTRUCTED,
        "rewards": r[0].tolist(),
        "zero_variance": bool(losses.zero_variance_groups(r)[0]),
        # + 0.0 turns IEEE -0.0 (from negating exact zeros) into 0.0 for printing; the values are equal
        "advantages": (advantages + 0.0).tolist(),
        "surrogate_loss": float(loss.detach()) + 0.0,
        "ratio_mean": stats["ratio/mean"],
        "response_lengths": [int(n) for n in mask.sum(dim=1)],
        "logp_grad": (logp_cur.grad + 0.0).tolist(),
        "logp_grad_formula": (expected + 0.0).tolist(),
        "max_abs_grad": float(logp_cur.grad.abs().max()),
    }


def zero_variance_group_table(clip_eps: float = 0.2, eps: float = 1e-8) -> list[dict]:
    """One row per case of CONSTANT_GROUP_CASES (see `constant_group_case`), with its name."""
    return [{"case": name, **constant_group_case(rewards, clip_eps, eps)} for name, rewards in CONSTANT_GROUP_CASES]


def format_constant_group_table(rows: list[dict]) -> str:
    """The table as text: rewards, advantages, loss, largest |gradient| per case."""
    lines = [f"({rows[0]['source']})" if rows else "",
             f"{'case':<22} {'rewards':<22} {'advantages':<46} {'loss':>10} {'max |grad|':>12}"]
    for r in rows:
        rewards = "[" + ", ".join(f"{x:g}" for x in r["rewards"]) + "]"
        adv = "[" + ", ".join(f"{a:+.8f}" for a in r["advantages"]) + "]"
        lines.append(f"{r['case']:<22} {rewards:<22} {adv:<46} {r['surrogate_loss']:>10.3g} {r['max_abs_grad']:>12.6g}")
    return "\n".join(lines)


# -- 2. The branches -----------------------------------------------------------------------


def check_branch_manifest(manifest: dict, config: PresetConfig, G: int, iterations: int) -> None:
    """A finished branch is reused only if it is the run asked for; otherwise say what differs."""
    identity = manifest["identity"]
    wanted = {"G": G, "iterations": iterations, "config_fingerprint": config.fingerprint()}
    diff = {k: (identity.get(k), v) for k, v in wanted.items() if identity.get(k) != v}
    if diff:
        raise ValueError(f"a finished run with other settings is in the way (found, wanted): {diff}; "
                         "it is evidence and is not overwritten: move it or choose another runs folder")


def run_branch(config: PresetConfig, G: int, run_dir: Path, *, iterations: int = BRANCH_ITERATIONS,
               start_file=None, sampler: str = "reference", device=None, progress: bool = True) -> dict:
    """One exercise branch: `loop.run_grpo` with G = G for `iterations` (the main run's loop).

    A finished branch is never rerun or overwritten: its manifest is checked and returned
    with "reused": True.
    """
    run_dir = Path(run_dir)
    if is_finished(run_dir):
        manifest = read_json(run_dir / "manifest.json")
        check_branch_manifest(manifest, config, G, iterations)
        return {**manifest, "reused": True}
    manifest = loop.run_grpo(config, run_dir, G=G, iterations=iterations, start_file=start_file,
                             sampler=sampler, device=device, progress=progress, restart=True)
    return {**manifest, "reused": False}


# -- 3. The same prompt presentations --------------------------------------------------------


def prompt_presentations(run_dir: str | Path) -> list[str]:
    """The problem ids a GRPO run presented, in order (4 per iteration), from its history.json."""
    return [pid for h in read_json(Path(run_dir) / "history.json") for pid in h["problem_ids"]]


def check_same_presentations(branch_dirs: dict[str, Path], main_dir: Path | None = None) -> dict:
    """Do the branches see the same prompts in the same order, from the same start?

    branch_dirs: {name: finished run folder}.  main_dir: the main G=4 run, compared on its
    first presentations (as many as a branch has), when it exists.  Top-level `equal` is
    True only when every branch's sequence equals the first's, every start digest is the
    same, and the main run (if present) begins with the same sequence.
    """
    names = list(branch_dirs)
    sequences = {n: prompt_presentations(branch_dirs[n]) for n in names}
    starts = {n: read_json(Path(branch_dirs[n]) / "manifest.json")["identity"]["start_digest"] for n in names}
    first = sequences[names[0]]
    report = {
        "presentations": len(first),
        "problem_ids": first,
        "branches": {n: {"presentations": len(sequences[n]), "equal_to_first": sequences[n] == first,
                         "start_digest": starts[n]} for n in names},
        "main_run": {"present": False},
    }
    equal = all(v["equal_to_first"] for v in report["branches"].values()) and len(set(starts.values())) == 1
    if main_dir is not None and is_finished(main_dir):
        main = prompt_presentations(main_dir)
        main_start = read_json(Path(main_dir) / "manifest.json")["identity"]["start_digest"]
        prefix_equal = main[: len(first)] == first
        report["main_run"] = {"present": True, "run_dir": Path(main_dir).name, "presentations": len(main),
                              "first_presentations_equal": prefix_equal, "start_digest": main_start,
                              "same_start": main_start == starts[names[0]]}
        equal = equal and prefix_equal and main_start == starts[names[0]]
    report["equal"] = equal
    return report


# -- 4. Budget and the zero-signal fraction ---------------------------------------------------


def expected_counts(iterations: int, G: int, prompts_per_iteration: int = 4,
                    updates_per_iteration: int = 2) -> dict:
    """What a GRPO run of this shape must consume: rollouts = iterations x prompts x G."""
    return {
        "iterations": iterations,
        "updates": iterations * updates_per_iteration,
        "presentations": iterations * prompts_per_iteration,
        "rollouts": iterations * prompts_per_iteration * G,
        "groups": iterations * prompts_per_iteration,
    }


def grpo_budget_row(run_dir: str | Path, name: str, config: PresetConfig) -> dict:
    """Counts and costs of one finished GRPO run, from its raw files; checked against `expected_counts`."""
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / "manifest.json")
    history = read_json(run_dir / "history.json")
    rollouts = loop.read_rollouts(run_dir)
    G = manifest["identity"]["G"]
    timings = loop.read_timings(run_dir)
    row = {
        "policy": name,
        "kind": "grpo",
        "G": G,
        "iterations": len(history),
        "updates": manifest["updates"],
        "presentations": sum(len(h["problem_ids"]) for h in history),
        "rollouts": len(rollouts),
        "generated_tokens": sum(len(r["response_ids"]) for r in rollouts),
        "seconds": manifest["seconds"],
        "seconds_generation": sum(t["generation"] for t in timings),
        "seconds_optimisation": sum(t["optimisation"] for t in timings),
        "zero_variance_measured": sum(h["frac_reward_zero_std"] for h in history) / len(history),
        "groups": sum(len(h["problem_ids"]) for h in history),
        "first_iteration_reward": history[0]["reward"],
        "mean_reward": sum(h["reward"] for h in history) / len(history),
    }
    expected = expected_counts(len(history), G, config.prompts_per_iteration, config.updates_per_iteration)
    wrong = {k: (row[k], v) for k, v in expected.items() if row[k] != v}
    if manifest["rollouts"] != row["rollouts"]:
        wrong["manifest rollouts"] = (manifest["rollouts"], row["rollouts"])
    if wrong:
        raise ValueError(f"{run_dir}: counts differ from the run's shape (measured, expected): {wrong}")
    report = run_dir / "resume_report.json"
    if report.exists():
        r = read_json(report)
        row["resume_equal"] = r["equal"]
        row["resume_check_seconds"] = r["cost"]["extra_for_the_check"]["total_seconds"]
    return row


def sft_budget_row(run_dir: str | Path, name: str) -> dict | None:
    """The warm start's or SFT's counts from its manifest (None when the run or its counts are missing).

    SFT generates nothing: its presentations are supervised example presentations, and it
    reads teacher-forced tokens rather than sampling them.
    """
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return None
    manifest = read_json(path)
    counts = manifest.get("counts")
    if not counts:
        return None
    return {
        "policy": name,
        "kind": "sft",
        "G": None,
        "iterations": None,
        "updates": counts["updates"],
        "presentations": counts["train_sequence_forwards"],
        "rollouts": 0,
        "generated_tokens": 0,
        "supervised_tokens": counts["train_supervised_tokens"],
        "seconds": manifest["times"]["total_seconds"],
    }


def warm_start_validation_success(config: PresetConfig, start_file: str | Path, *, draws: int = 4,
                                  limit: int | None = None, device: str | None = None,
                                  batch_size: int = 64) -> dict:
    """p for the zero-signal curve: the warm start's per-draw sampled success on VALIDATION problems.

    Definition (chosen once, stated in budget.json): `draws` samples per validation problem
    at temperature 1, full vocabulary, seeds fixed by the config's seed; p = correct samples
    / all samples (never best-of-draws).  Validation, not test: the test split is held out
    for the evaluation of the final policies.  `limit` keeps the first N problems (tests).
    """
    from ..task import data
    from ..models import presets, sampling, scoring
    from ..task.verifier import score

    data.check_path_access("learning", start_file)
    began = time.perf_counter()
    statements = data.open_records("statements", "validation", "learning")[:limit]
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    model, tokenizer = presets.load(config.name, state=start_file, device=device or presets.default_device(config.name))
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + VALIDATION_DRAW_SEED_OFFSET)
    seeds = torch.randint(0, core.SEED_RANGE, (len(statements) * draws,), generator=generator).tolist()
    prompts = [scoring.build_prompt_ids(tokenizer, s["statement"], config.max_prompt_tokens)
               for s in statements for _ in range(draws)]
    problem_ids = [s["id"] for s in statements for _ in range(draws)]
    rollouts = sampling.sample_fast(model, tokenizer, prompts, seeds, max_new_tokens=config.max_new_tokens,
                                    problem_ids=problem_ids, batch_size=batch_size)
    correct = sum(score(r.text, r.finish_reason, labels[r.problem_id]["problem"], r.tokenization_valid).reward
                  for r in rollouts)
    return {
        "p": correct / len(rollouts),
        "definition": (f"warm start's per-draw sampled success on {len(statements)} validation problems x {draws} "
                       "draws at temperature 1 (seeded), correct samples / all samples; not the test set, "
                       "not best-of-draws"),
        "problems": len(statements),
        "draws": draws,
        "responses": len(rollouts),
        "correct": correct,
        "sampler": "fast",
        "start_file": display_path(Path(start_file)),
        "seconds": time.perf_counter() - began,
    }


def zero_signal_points(rows: list[dict], p: float) -> list[dict]:
    """Measured zero-variance fraction of each GRPO row beside p^G + (1-p)^G."""
    return [{"policy": r["policy"], "G": r["G"], "groups": r["groups"],
             "measured": r["zero_variance_measured"], "predicted": expected_frac_reward_zero_std(p, r["G"])}
            for r in rows if r["kind"] == "grpo"]


def budget_statements(rows: list[dict], config: PresetConfig) -> dict[str, str]:
    """The two statements the chapter and the table must carry, with the run's own numbers."""
    by = {r["policy"]: r for r in rows}
    branches = [r for r in rows if r["kind"] == "grpo" and r["G"] != MAIN_GROUP_SIZE]
    if len(branches) >= 2:
        small, large = min(branches, key=lambda r: r["G"]), max(branches, key=lambda r: r["G"])
        updates = (f"each make {small['updates']} updates" if small["updates"] == large["updates"]
                   else f"make {small['updates']} and {large['updates']} updates")
        cost = (f"Same updates is not same cost: G={small['G']} and G={large['G']} {updates} "
                f"on the same {small['presentations']} prompt presentations, but G={large['G']} sampled "
                f"{large['rollouts']} rollouts "
                f"({large['generated_tokens']} generated tokens, {large['seconds']:.0f} s) against "
                f"{small['rollouts']} ({small['generated_tokens']} tokens, {small['seconds']:.0f} s) for "
                f"G={small['G']}.")
    else:
        cost = ("Same updates is not same cost: at equal updates and prompts, a branch with G responses per "
                "prompt samples and scores G/2 times the rollouts of G=2.")
    main = by.get("grpo")
    if main:
        shape = f"{main['iterations']} iterations ({main['updates']} updates, {main['presentations']} presentations)"
    else:
        it = config.grpo_iterations
        shape = f"{it} iterations ({it * config.updates_per_iteration} updates, {it * config.prompts_per_iteration} presentations)"
    branch_it = branches[0]["iterations"] if branches else BRANCH_ITERATIONS
    ablation = (f"The main G=4 run has {shape}, the branches {branch_it}: comparing it with them changes the "
                "number of updates and prompts as well as G, so it is not an ablation of group size alone; only "
                "the two branches (same start, same prompts, same updates) differ in G alone.")
    return {"same_updates_not_same_cost": cost, "not_a_group_size_ablation": ablation}


def budget_table(runs_root: str | Path, config: PresetConfig, p_info: dict | None = None,
                 group_sizes=BRANCH_GROUP_SIZES) -> dict:
    """budget.json: rows (warm start and SFT if their manifests have counts, main G=4 run if
    finished, the branches), the zero-signal points against p^G + (1-p)^G, and the statements."""
    runs_root = Path(runs_root)
    rows = [row for name in ("warm_start", "sft") if (row := sft_budget_row(runs_root / name, name))]
    main = branch_dir(runs_root, MAIN_GROUP_SIZE)
    if is_finished(main):
        rows.append(grpo_budget_row(main, "grpo", config))
    for G in group_sizes:
        rows.append(grpo_budget_row(branch_dir(runs_root, G), branch_dir(runs_root, G).name, config))
    out = {"rows": rows, "statements": budget_statements(rows, config)}
    if p_info is not None:
        out["zero_signal"] = {"p": p_info, "points": zero_signal_points(rows, p_info["p"])}
    return out


def format_budget_table(budget: dict) -> str:
    """The budget table as text, followed by both statements (the chapter prints it whole)."""
    def cell(v, fmt="{}"):
        return "-" if v is None else fmt.format(v)

    head = f"{'policy':<11} {'G':>3} {'iters':>6} {'updates':>8} {'prompts':>8} {'rollouts':>9} {'gen tokens':>11} {'seconds':>9}"
    lines = [head, "-" * len(head)]
    for r in budget["rows"]:
        lines.append(f"{r['policy']:<11} {cell(r['G']):>3} {cell(r['iterations']):>6} {r['updates']:>8} "
                     f"{r['presentations']:>8} {r['rollouts']:>9} {r['generated_tokens']:>11} {r['seconds']:>9.1f}")
    zero = budget.get("zero_signal")
    if zero:
        lines += ["", f"zero-variance fraction, p = {zero['p']['p']:.4f} ({zero['p']['definition']})",
                  f"{'policy':<11} {'G':>3} {'groups':>7} {'measured':>9} {'p^G+(1-p)^G':>12}"]
        for pt in zero["points"]:
            lines.append(f"{pt['policy']:<11} {pt['G']:>3} {pt['groups']:>7} {pt['measured']:>9.3f} "
                         f"{pt['predicted']:>12.3f}")
    lines += ["", budget["statements"]["same_updates_not_same_cost"],
              budget["statements"]["not_a_group_size_ablation"]]
    return "\n".join(lines)


def print_budget_table(budget: dict) -> str:
    """Print the table and the two statements (same updates is not same cost; not an ablation)."""
    text = format_budget_table(budget)
    print(text)
    return text


# -- 5. Protection of the main runs -------------------------------------------------------------

PROTECTED_CODE = ("labkit/config.py", "labkit/task/verifier.py")
RESULTS_FILE = Path("evaluation") / "results.json"


def results_main_entries(results: dict) -> dict:
    """The main policies' entries of a results.json (under "policies" if the file has that key)."""
    entries = results.get("policies", results)
    return {name: entries.get(name) for name in MAIN_POLICIES}


def protected_files(runs_root: str | Path, code_root: str | Path = REPO_ROOT) -> list[tuple[str, Path]]:
    """(category, path) of every protected file that exists now.

    weights:       the main policies' safetensors (warm start, SFT, GRPO)
    results:       every other file of the three main run folders (history, manifests,
                   resume reports, rollouts; not their lock or saved states, which never leave
                   the machine that made them) and of their evaluation folders
                   (evaluation/<policy>/: predictions, manifest, costs)
    configuration: labkit/config.py and the verifier's source (the verifier is untouched)
    The main entries of evaluation/results.json are protected apart (`record_protection`).
    """
    runs_root, code_root = Path(runs_root), Path(code_root)
    out = []
    for folder in [runs_root / name for name in MAIN_POLICIES] + [runs_root / "evaluation" / name for name in MAIN_POLICIES]:
        if folder.is_dir():
            for path in sorted(p for p in folder.rglob("*") if p.is_file() and not _local_only(p.relative_to(folder))):
                out.append(("weights" if path.suffix == ".safetensors" else "results", path))
    return out + [("configuration", code_root / rel) for rel in PROTECTED_CODE]


def _local_only(rel: Path) -> bool:
    """A run's lock and saved states: they stay on the machine that made the run (.gitignore), so a
    list that held them would differ between that machine and a clone."""
    return rel.name == ".lock" or rel.parts[0] == "states"


def _label(path: Path, runs_root: Path, code_root: Path) -> str:
    for base, prefix in ((runs_root, f"runs/{runs_root.name}/"), (code_root, "")):
        if path.is_relative_to(base):
            return prefix + str(path.relative_to(base))
    return str(path)


def record_protection(runs_root: str | Path, code_root: str | Path = REPO_ROOT) -> dict:
    """{label: {"category", "sha256"}} of the protected files, plus the main results entries.

    The exercise adds its own branches' entries to evaluation/results.json, so the whole
    file is expected to change; what is protected is the JSON of its warm_start / sft /
    grpo entries (sorted keys), hashed under the label "<results.json>#main_entries".
    A file absent now is recorded with sha256 None (it must still be absent afterwards).
    """
    runs_root, code_root = Path(runs_root), Path(code_root)
    out = {_label(p, runs_root, code_root): {"category": c, "sha256": sha256_file(p) if p.exists() else None}
           for c, p in protected_files(runs_root, code_root)}
    for name in MAIN_POLICIES:  # the main weights are named even while absent
        label = f"runs/{runs_root.name}/{name}/model.safetensors"
        out.setdefault(label, {"category": "weights", "sha256": None})
    results = runs_root / RESULTS_FILE
    entries = results_main_entries(read_json(results)) if results.exists() else None
    out[f"runs/{runs_root.name}/{RESULTS_FILE}#main_entries"] = {
        "category": "results",
        "sha256": None if entries is None else sha256_bytes(dumps_json(entries).encode("utf-8")),
    }
    return out


def check_protection(before: dict, runs_root: str | Path, code_root: str | Path = REPO_ROOT) -> dict:
    """Compare the recorded hashes with the files now: protection.json.

    Top-level `unchanged` is True only when every protected entry has the same hash as
    before (a file that appeared or vanished counts as changed); `changed` names the others.
    """
    after = record_protection(runs_root, code_root)
    files = []
    for label in sorted(set(before) | set(after)):
        b, a = before.get(label, {}).get("sha256"), after.get(label, {}).get("sha256")
        category = (before.get(label) or after.get(label))["category"]
        files.append({"file": label, "category": category, "sha256_before": b, "sha256_after": a,
                      "unchanged": a == b})
    changed = [f["file"] for f in files if not f["unchanged"]]
    return {
        "unchanged": not changed,
        "changed": changed,
        "files": files,
        "results_json_note": "evaluation/results.json gains the exercise's entries; its main policies' "
                             "entries (warm_start, sft, grpo) are what is protected",
    }


# -- 6. Diagnose-this: a bonus reward to force a curve ----------------------------------------


def forced_bonus_rewards(rewards: torch.Tensor, bonus) -> torch.Tensor:
    """A "fix" for zero-signal groups: add a bonus to the verifier's rewards.  Refused.

    rewards: (groups, G) verifier rewards, each 0 or 1.  bonus: a number or a tensor
    broadcastable to rewards.  A zero bonus changes nothing and the rewards come back as
    they are; any other bonus raises ValueError: the verifier's reward is the only reward
    (no style reward, no partial credit), and a group of equal rewards is reported as
    zero signal, never broken by an invented winner.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2:
        raise ValueError(f"rewards must be a (groups, G) tensor of verifier rewards, got {rewards!r}")
    if not ((rewards == 0) | (rewards == 1)).all():
        raise ValueError(f"verifier rewards are 0 or 1; got {rewards.tolist()}, which the verifier cannot have given")
    bonus = torch.as_tensor(bonus, dtype=rewards.dtype).expand_as(rewards)
    if (bonus != 0).any():  # NaN counts as a bonus too
        zero = losses.zero_variance_groups(rewards)
        example = ""
        if torch.isfinite(bonus).all():
            forced = losses.group_advantages(rewards + bonus)
            broken = [i for i in range(rewards.shape[0]) if zero[i] and (forced[i] != 0).any()]
            if broken:
                example = (f"; e.g. group {broken[0]} {rewards[broken[0]].tolist()} would get the invented "
                           f"advantages {[round(a, 4) for a in forced[broken[0]].tolist()]}")
        raise ValueError(
            f"refused: a bonus added to the verifier's rewards ({int((bonus != 0).sum())} non-zero entries, e.g. "
            f"{float(bonus[bonus != 0][0]):.4g}). The verifier's reward is the "
            f"only reward (1 for a complete, valid, correct answer, else 0); {int(zero.sum())} of "
            f"{rewards.shape[0]} groups have zero variance (fraction {float(zero.float().mean()):.3f}), and that "
            f"zero result is reported as it is{example}."
        )
    return rewards.clone()


# -- 7. The whole exercise ------------------------------------------------------------------


def evaluate_policies(config: PresetConfig, names: list[str], device: str | None = None) -> dict[str, str]:
    """Evaluate the branches exactly like the main policies, with `labkit.eval.evaluate` (imported here).

    Each branch's model.safetensors answers the same 200 test problems, greedy and
    `eval_draws` seeded draws (seeds shared with every policy), with the sampler, batch size
    and response limit the main evaluations used (read from their manifest when present);
    its predictions go to evaluation/<branch>/ and results.json is recomputed from all
    the predictions (the main policies' entries are a pure function of their own files).
    A finished evaluation is kept.  Returns {name: "evaluated" | "kept"}.
    """
    from ..eval import evaluate  # the evaluation phase's own module: imported only when evaluating

    root = evaluate.evaluation_root(config.name)
    settings = {}
    for main in MAIN_POLICIES:
        path = root / main / evaluate.MANIFEST_FILE
        if path.exists():
            m = read_json(path)
            settings = {"sampler": m["sampler"], "draws": m["draws"], "max_new_tokens": m["max_new_tokens"]}
            if m.get("batch_size"):
                settings["batch_size"] = m["batch_size"]
            break
    status = {}
    for name in names:
        if is_finished(root / name):
            status[name] = "kept"
        else:
            evaluate.run_inference(config.name, name, device=device, **settings)
            status[name] = "evaluated"
    evaluate.write_results(config.name)
    return status


def run_branches(config: PresetConfig, runs_root: Path, group_sizes: tuple[int, ...], iterations: int,
                 start_file: Path, sampler: str, resume_checks: bool, device, progress: bool,
                 steps: dict) -> tuple[dict[str, Path], dict]:
    """Stages 3-5 of `run_exercise`: the branches (reused when finished), the check that they saw
    the same prompt presentations from the same start, and their resume checks.  Adds each
    branch's cost to `steps`; returns ({name: folder}, the presentations record)."""
    out_dir, main_dir = runs_root / "group_size", branch_dir(runs_root, MAIN_GROUP_SIZE)
    # Stage 3: the branches.
    dirs = {branch_dir(runs_root, G).name: branch_dir(runs_root, G) for G in group_sizes}
    for G, (name, folder) in zip(group_sizes, dirs.items()):
        t0 = time.perf_counter()
        m = run_branch(config, G, folder, iterations=iterations, start_file=start_file, sampler=sampler,
                       device=device, progress=progress)
        steps[name] = {"reused": m["reused"], "seconds": time.perf_counter() - t0}

    # Stage 4: same prompts, same start.
    presentations = check_same_presentations(dirs, main_dir)
    write_json(out_dir / "presentations.json", presentations)
    if not presentations["equal"]:
        raise RuntimeError(f"the branches did not see the same prompt presentations from the same start; "
                           f"see {out_dir / 'presentations.json'}")

    # Stage 5: resume checks.
    if resume_checks:
        for G, (name, folder) in zip(group_sizes, dirs.items()):
            if not (folder / "resume_report.json").exists():
                report = loop.resume_check(config, G=G, stop_at=RESUME_STOP_AT, run_dir=folder,
                                           sampler=sampler, device=device)
                if not report["equal"]:
                    raise RuntimeError(f"{name}: the resumed run differs from the continuous one: "
                                       f"{report['end_state']['different_fields'][:5]}")
    return dirs, presentations


def run_exercise(
    config: PresetConfig | str,
    *,
    runs_root: str | Path | None = None,
    code_root: str | Path = REPO_ROOT,
    group_sizes: tuple[int, ...] = BRANCH_GROUP_SIZES,
    iterations: int = BRANCH_ITERATIONS,
    start_file: str | Path | None = None,
    sampler: str | None = None,
    resume_checks: bool = True,
    evaluate: bool = True,
    validation_limit: int | None = None,
    device: str | None = None,
    progress: bool = True,
) -> dict:
    """The exercise end to end, into runs_root/group_size/; returns its manifest.

    Stages (each skipped when its evidence already exists; nothing finished is overwritten):
      1. protection: record the hashes of the main runs (kept from the first attempt)
      2. the constant-group table (constructed rewards)
      3. the branches G in group_sizes, `iterations` each, from the warm start
      4. their prompt presentations checked equal (and equal to the main run's first ones)
      5. their resume checks (stop after iteration 8, fresh processes, exact comparison)
      6. their evaluation with labkit.eval.evaluate, like the main policies
      7. p (warm start, validation draws) and the budget table
      8. protection checked; protection.json; FINISHED only when it is unchanged
    resume_checks and evaluate use the preset's own commands, so they need the preset's own
    config and warm start; tests switch them off.
    """
    config = get_preset(config) if isinstance(config, str) else config
    runs_root = Path(runs_root) if runs_root is not None else runs_root_of(config.name)
    out_dir = runs_root / "group_size"
    if is_finished(out_dir):
        raise RunExistsError(f"{out_dir} holds a finished exercise, which is evidence and is never overwritten")
    preset_run = config == get_preset(config.name) and start_file is None and runs_root == runs_root_of(config.name)
    if (resume_checks or evaluate) and not preset_run:
        raise ValueError("resume checks and evaluation run the preset's own commands on runs/<preset>; "
                         "with another config, start file or runs folder pass resume_checks=False, evaluate=False")
    start_file = Path(start_file) if start_file is not None else loop.warm_start_file(config.name)
    main_dir = branch_dir(runs_root, MAIN_GROUP_SIZE)
    if sampler is None:  # the main run's sampler, so that the branches run the same loop
        sampler = read_json(main_dir / "manifest.json")["identity"]["sampler"] if is_finished(main_dir) else "reference"
    began = time.perf_counter()
    steps = {}

    # Stage 1: the hashes before anything runs (a retry keeps the first attempt's).
    before_path = out_dir / "protection_before.json"
    if not before_path.exists():
        write_json(before_path, record_protection(runs_root, code_root))
    before = read_json(before_path)

    # Stage 2: constructed constant groups.
    write_json(out_dir / "zero_variance_groups.json", zero_variance_group_table(config.clip_eps, config.advantage_eps))

    # Stages 3-5: the branches, their prompt presentations, their resume checks.
    dirs, presentations = run_branches(config, runs_root, group_sizes, iterations, start_file, sampler,
                                       resume_checks, device, progress, steps)

    # Stage 6: evaluation like the main policies.
    if evaluate:
        t0 = time.perf_counter()
        steps["evaluation"] = {"status": evaluate_policies(config, list(dirs), device=device),
                               "seconds": time.perf_counter() - t0}

    # Stage 7: p and the budget.
    p_path = out_dir / "warm_start_p.json"
    if not p_path.exists():
        write_json(p_path, warm_start_validation_success(config, start_file, draws=config.eval_draws,
                                                         limit=validation_limit, device=device))
    budget = budget_table(runs_root, config, read_json(p_path), group_sizes)
    write_json(out_dir / "budget.json", budget)

    # Stage 8: the protected files, checked.
    protection = check_protection(before, runs_root, code_root)
    write_json(out_dir / "protection.json", protection)
    manifest = {
        "step": "group_size",
        "preset": config.name,
        "config_fingerprint": config.fingerprint(),
        "group_sizes": list(group_sizes),
        "iterations": iterations,
        "sampler": sampler,
        "resume_checks": resume_checks,
        "evaluated": evaluate,
        "presentations_equal": presentations["equal"],
        "protection_unchanged": protection["unchanged"],
        "steps": steps,
        "seconds": time.perf_counter() - began,
    }
    write_json(out_dir / "manifest.json", manifest)
    if not protection["unchanged"]:
        raise RuntimeError(f"protected files changed during the exercise: {protection['changed']}; "
                           f"see {out_dir / 'protection.json'}")
    mark_finished(out_dir, {"protection_unchanged": True})
    return manifest
