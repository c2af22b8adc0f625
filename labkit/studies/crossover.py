"""Does the base catch up at large k?  pass@k of worked answers, k = 1 ... 256, before and after RL (issue 56).

    python -m labkit crossover [--draws 256] [--chains-per-k 13]     # -> runs/tiny/crossover/

Yue et al. (2025) find that RL with a verifiable reward raises pass@1 but not pass@k at large k: given
enough tries, the base solves as many problems as the RL-trained model, often more, and the curves
cross.  Chapter 11 measures pass@8 only.  Here each policy answers every chain `draws` times
(temperature 1, the fast sampler, `worked.score_worked`), and pass@k is the unbiased estimator
1 - C(n - c, k) / C(n, k) of each chain's n draws with c right (`evaluate.pass_at_k`), averaged over chains, for every k
up to n.  The chains are chapter 11's test chains (`thinking_base.TEST_SEED`), the first
`chains_per_k` of each k = 1 ... 8; the draw seeds are this study's own, the same for every policy,
so that the policies are compared chain by chain.

Policies: the thinking bases rare_2, rare_10 and skill, and chapter 11's runs from rare_2 and rare_10
(`POLICIES`).  Each model is read from its finished folder, checked against its manifest: the bases'
and the runs' weights are not committed (`python -m labkit cache fill` rebuilds them).

Which model was counted: a model rebuilt on another CPU than the one that built the committed run can
differ in the last bits of its weights (its updates round differently) and still answer every test
chain as the committed run does.  Each counts file records the SHA-256 of the model counted and a digest
of the test profile of the folder it came from (`profile_digest`: the rows of its profile.json.gz,
1,600 answers for a run); `provenance` compares both with the committed run's, so a reader sees
whether the very model was counted, or a rebuild whose test answers are the committed run's, one by one.

Files: `counts-<policy>.json` (per chain: k, index, n, right, thinks; the model's SHA-256 and profile
digest), written whole as each policy finishes, so that a rerun skips the policies already done;
`manifest.json`, FINISHED.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from ..eval import evaluate
from ..lab.runs import RunFolder, atomic_write_text, preset_folder, sha256_bytes, sha256_file, write_json
from ..lab.runtime import code_digests, environment, hashed_seed
from ..lab.skeleton import holding
from ..task import worked
from . import thinking_base

POLICIES = {"rare_2": ("base", "rare_2"), "from_rare_2": ("run", "from_rare_2"),
            "rare_10": ("base", "rare_10"), "from_rare_10": ("run", "from_rare_10"), "skill": ("base", "skill")}
"""{policy: (kind, name)}: a thinking base (`thinking_base`) or one of chapter 11's runs (`reasoning`)"""
DRAWS = 256
CHAINS_PER_K = 13  # 104 chains: 13 x 8 values of k


def draw_seed(k: int, index: int, draw: int) -> int:
    """The sampling seed of one (k, chain, draw), the same for every policy."""
    return hashed_seed(f"crossover/{k}/{index}/{draw}")


def curve(counts: list[dict], ks: list[int]) -> list[float]:
    """Mean pass@k over the chains of `counts` (rows {"n", "right"}, every n the same), for each k of `ks`
    (`evaluate.mean_pass_at_k`: the unbiased estimator, in exact arithmetic)."""
    n = {r["n"] for r in counts}
    if len(n) != 1:
        raise ValueError(f"pass@k over chains needs the same number of draws for each, got {sorted(n)}")
    draws, right = n.pop(), [r["right"] for r in counts]
    return [evaluate.mean_pass_at_k(right, draws, k) for k in ks]


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else ks + [n]


def crossing(a: list[float], b: list[float], ks: list[int]) -> int | None:
    """The first k at which curve `a` (the base's) reaches curve `b` (the RL run's); None if it never does."""
    return next((k for k, x, y in zip(ks, a, b) if x >= y), None)


PAIRS = (("rare_2", "from_rare_2"), ("rare_10", "from_rare_10"))
"""(base, the RL run from it): the pairs compared chain by chain"""


def compare(base: list[dict], run: list[dict], ks: list[int]) -> list[dict]:
    """The run's pass@k against the base's, chain by chain, for each k of `ks` (one family: Holm).

    base, run: per-chain counts of the same chains ({"k", "index", "n", "right"}, every n the same).
    For each k, each chain's pass@k (`evaluate.pass_at_k`) of the run minus the base's is one paired
    difference; returns per k {"k", "base", "run" (mean pass@k), "difference" (their mean), "interval"
    (95% t), "p" and "method" (the sign-flip permutation test, `paired.permutation_p`), "p_holm"}."""
    from ..eval import paired

    key = lambda r: (r["k"], r["index"])  # noqa: E731
    by_chain = {key(r): r for r in base}
    if sorted(by_chain) != sorted(key(r) for r in run) or len(by_chain) != len(base):
        raise ValueError("compare needs the same chains, once each, in the base's counts and the run's")
    out = []
    for k in ks:
        a = [evaluate.pass_at_k(by_chain[key(r)]["n"], by_chain[key(r)]["right"], k) for r in run]
        b = [evaluate.pass_at_k(r["n"], r["right"], k) for r in run]
        d = [y - x for x, y in zip(a, b)]
        p, method = paired.permutation_p(d)
        out.append({"k": k, "base": curve(base, [k])[0], "run": curve(run, [k])[0], "difference": sum(d) / len(d),
                    "interval": paired.mean_interval(d), "p": p, "method": method})
    for row, adjusted in zip(out, paired.holm([row["p"] for row in out])):
        row["p_holm"] = adjusted
    return out


def policy_folder(preset: str, policy: str) -> RunFolder:
    """The finished folder of a policy: its thinking base's or its reasoning run's."""
    from . import reasoning

    kind, name = POLICIES[policy]
    return RunFolder(thinking_base.default_run_dir(preset, name) if kind == "base"
                     else reasoning.default_run_dir(preset, name))


def profile_rows(folder: RunFolder) -> list[dict]:
    """The test-profile rows of a finished base or run, checked against its manifest."""
    folder.check_file("profile.json.gz")
    return json.loads(gzip.decompress((folder / "profile.json.gz").read_bytes()))["rows"]


def profile_digest(folder: RunFolder) -> str:
    """SHA-256 of the test-profile rows of a finished base or run, as canonical JSON: two folders whose models
    gave the same answers to every test draw have the same digest."""
    return sha256_bytes(json.dumps(profile_rows(folder), sort_keys=True).encode())


def profile_summary(rows: list[dict]) -> dict:
    """{"think_rate", "accuracy"} of test-profile rows: the shares of draws that work it out and that are right."""
    return {"think_rate": sum(bool(r["thinks"]) for r in rows) / len(rows),
            "accuracy": sum(r["reward"] for r in rows) / len(rows)}


def provenance(counted_files: dict[str, dict], preset: str = "tiny") -> dict[str, dict]:
    """{policy: {"model_sha256", "committed_model_sha256", "same_model", "same_profile", "committed_profile",
    "counted_profile"}}: whether each policy's counts came from the committed run's very model, else whether
    from a rebuild whose test answers are the committed run's (its profile digest); the profiles' summaries
    (`profile_summary`) of the committed folder and of the one counted (None where its counts file predates
    the field: only where the answers are the committed ones).  counted_files: {policy: its counts file}."""
    out = {}
    for policy, counted in counted_files.items():
        folder = policy_folder(preset, policy)
        committed = folder.manifest()["ledger"]["files"]["model.safetensors"]["sha256"]
        same_profile = counted["profile_digest"] == profile_digest(folder)
        mine = profile_summary(profile_rows(folder))
        out[policy] = {"model_sha256": counted["model_sha256"], "committed_model_sha256": committed,
                       "same_model": counted["model_sha256"] == committed, "same_profile": same_profile,
                       "committed_profile": mine,
                       "counted_profile": counted.get("profile_summary", mine if same_profile else None)}
    return out


def model_file(preset: str, policy: str) -> Path:
    """The policy's model file from its finished folder, checked against its manifest."""
    kind, name = POLICIES[policy]
    folder = policy_folder(preset, policy)
    folder.manifest()  # refuses a folder that is missing, unfinished or damaged
    path = folder / "model.safetensors"
    if not path.is_file():
        step = "thinking" if kind == "base" else "reasoning"
        raise FileNotFoundError(f"{path} is not here (its weights are not committed): "
                                f"`python -m labkit cache fill --steps {step} --runs {name}` rebuilds it")
    folder.check_file("model.safetensors")
    return path


def count_policy(model, tokenizer, chains_by_k: dict[int, list[worked.Chain]], draws: int, progress=None) -> list[dict]:
    """`draws` temperature-1 worked answers to every chain, sampled chain by chain (a batch of `draws`);
    one row per chain: {"k", "index", "n", "right", "thinks"}."""
    from ..eval import think_profile
    from ..models import sampling

    sample = sampling.get_sampler("fast")
    rows = []
    for k in sorted(chains_by_k):
        for i, chain in enumerate(chains_by_k[k]):
            prompt = think_profile.worked_prompt_ids(tokenizer, chain)
            rollouts = sample(model, tokenizer, [prompt] * draws, [draw_seed(k, i, d) for d in range(draws)],
                              max_new_tokens=worked.WORKED_MAX_NEW_TOKENS)
            verdicts = [worked.score_worked(r.text, r.finish_reason, chain, r.tokenization_valid) for r in rollouts]
            rows.append({"k": k, "index": i, "n": draws, "right": sum(v.reward for v in verdicts),
                         "thinks": sum(bool(v.thinks) for v in verdicts)})
            if progress is not None:
                progress.update(1)
    return rows


def default_run_dir(preset: str = "tiny") -> Path:
    return preset_folder(preset, "crossover")


def run(preset: str = "tiny", *, policies: tuple[str, ...] = tuple(POLICIES), draws: int = DRAWS,
        chains_per_k: int = CHAINS_PER_K, out: str | Path | None = None, overwrite: bool = False,
        progress: bool = True) -> dict:
    """Count every policy's right answers per chain; returns {policy: rows}.  A policy counted by an
    earlier, interrupted call with the same settings is kept (its file is whole: written atomically);
    `overwrite` recounts a finished study."""
    import torch
    from tqdm.auto import tqdm

    from ..models import presets

    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: the thinking bases are the tiny preset's")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"policies {unknown or list(policies)}: expected some of {list(POLICIES)}")
    if not 1 <= draws <= 4096 or not 1 <= chains_per_k <= thinking_base.PROFILE_CHAINS_PER_K:
        raise ValueError(f"draws {draws}, chains per k {chains_per_k}: draws in 1..4096, chains per k in "
                         f"1..{thinking_base.PROFILE_CHAINS_PER_K} (the test chains)")
    chains = {k: c[:chains_per_k] for k, c in
              thinking_base.held_out_chains(thinking_base.TEST_SEED, thinking_base.PROFILE_CHAINS_PER_K).items()}
    began, counted = time.perf_counter(), {}
    with holding(RunFolder(out or default_run_dir(preset)), overwrite) as folder:
        for policy in policies:
            name = f"counts-{policy}.json"
            if (folder / name).is_file() and not overwrite:  # counted by an earlier call (interrupted after it)
                kept = json.loads((folder / name).read_text())
                if kept["draws"] == draws and kept["chains_per_k"] == chains_per_k and "model_sha256" in kept:
                    counted[policy] = kept["chains"]
                    continue
            path = model_file(preset, policy)
            model, tokenizer = presets.load("tiny", state=path, device="cpu")
            model.eval()
            bar = tqdm(total=sum(len(c) for c in chains.values()), desc=policy, unit="chain", disable=not progress)
            with torch.no_grad():
                counted[policy] = count_policy(model, tokenizer, chains, draws, bar)
            bar.close()
            atomic_write_text(folder / name, json.dumps({"policy": policy, "draws": draws, "chains_per_k": chains_per_k,
                                                         "model_sha256": sha256_file(path),
                                                         "profile_digest": profile_digest(policy_folder(preset, policy)),
                                                         "profile_summary": profile_summary(
                                                             profile_rows(policy_folder(preset, policy))),
                                                         "chains": counted[policy]}, sort_keys=True, indent=1))
        for policy in policies:
            folder.register(f"counts-{policy}.json")
        write_json(folder / "manifest.json", {"step": "crossover", "policies": list(policies), "draws": draws,
                                              "chains_per_k": chains_per_k, "code_sha256": code_digests(),
                                              "environment": environment("cpu"),
                                              "seconds": time.perf_counter() - began, "ledger": folder.ledger()})
        folder.mark_finished({"policies": list(policies)})
    return counted


def read_files(preset: str = "tiny", out: str | Path | None = None) -> dict[str, dict]:
    """{policy: its counts file's content} of the finished study (in `out`, default the preset's), each file
    checked against its manifest."""
    folder = RunFolder(out or default_run_dir(preset))
    files = {}
    for policy in folder.manifest()["policies"]:
        folder.check_file(f"counts-{policy}.json")
        files[policy] = json.loads((folder / f"counts-{policy}.json").read_text())
    return files


def read(preset: str = "tiny", out: str | Path | None = None) -> dict[str, list[dict]]:
    """{policy: per-chain counts} of the finished study (`read_files`)."""
    return {policy: counted["chains"] for policy, counted in read_files(preset, out).items()}
