"""Reward over-optimisation on real runs: the proxy rises, the truth falls (chapter 10).

    python -m labkit overoptimisation          # -> runs/tiny/overoptimisation/

Gao, Schulman and Hilton (2022), "Scaling laws for reward model overoptimization": as a policy
moves away from its start (measured by KL, or its square root), a learned proxy's reward keeps
rising while the true reward rises, peaks and falls, and a weaker proxy peaks sooner.  This
module makes that experiment on the tiny model, with the lab's exact verifier as the truth.

1. Proxies of different strength.  Each is the learned verifier of `labkit.studies.reward_model` (a
   logistic regression on five judge-scored features, paid at p >= 0.5), refitted on a share of
   that run's labelled TRAINING responses and measured on its held-out ones (the same 776 for
   every proxy):

       name             judge        share of the training responses
       warm_start_10    warm start   10%     the learned verifier's own judge
       warm_start_30    warm start   30%
       warm_start_100   warm start   100%    = the learned verifier itself (same data, same fit)
       base_10          base         10%     the judge is the pretrained base, which never saw
       base_100         base         100%    the lab's answer format: a blind spot by design

   The subsets are nested: a response's problem is in the p-share when
   SHA-256("overoptimisation/subset/<id>") < p * 2^64, so the 10% lies inside the 30%.

2. Best-of-n against each proxy (no training).  The warm start answers each of the 200
   validation problems 32 times (seeded, temperature 1); best-of-n keeps the draw the proxy
   scores highest.  Its expected true reward over all n-subsets of the 32 draws is exact: with
   the draws sorted by the proxy's p (ties: the later draw ranks higher), the i-th lowest
   (1-based) is the best of a random n-subset with probability C(i-1, n-1) / C(32, n).  Its KL
   to the warm start is log n - (n - 1) / n (exact for a continuous score).

3. GRPO against a proxy.  The larger run's loop (`labkit.studies.larger_run`: 32 prompts x G=8 at 1e-4,
   the fast sampler, shared-prompt scoring) with `Variant(reward="learned")`, the proxy swapped
   in, the KL term on (0.02) or off, for SETTINGS' iterations.  Every `curve_every` iterations
   the policy answers the same 200 validation problems 4 times (seeds
   hashed_seed("overoptimisation/<id>/<draw>"), the same at every checkpoint and in every run:
   the checkpoints are paired) and each answer is scored by the verifier and the proxy; the
   exact sequence KL to the start, E_y [sum_t KL(pi(.|x, y<t) || pi_0(.|x, y<t))], is measured
   on those answers.  Each checkpoint keeps the 800 answers' texts (why each stopped, which held an undecodable id), so that
   the true reward can be recomputed from them and the committed labels alone.

Outputs (committed, small): proxies/<name>.safetensors with proxies.json (their held-out
precision and recall), best_of_n.jsonl.gz (every draw with its verdict, "kind" saying how a wrong
one is wrong (`fooled_kind`), and each proxy's p), settings/<name>.jsonl.gz (one row: a run's
curves, its per-iteration training means, and the responses that fooled the proxy in its first
and last iterations), times.json (each part's wall seconds), manifest.json (every file's
digest; written last, so it says the step is built).  The GRPO run folders themselves (rollouts, states, final
model) stay in runs/<preset>/overoptimisation/grpo/, ignored by git: they are the runs' evidence
and resume points on the machine that made them, 4 MB of model per run that no chapter reads.
`labkit.studies.overoptimisation_summary` turns the files into the chapter's verdicts.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..lab.runs import (REPO_ROOT, ArtifactError, RunFolder, UnfinishedRunError, display_path, preset_folder, read_json,
                        read_jsonl, sha256_file, write_json, write_jsonl)
from ..lab.skeleton import holding, refuse_earlier_attempt
from ..lab.runtime import code_digests, data_digests, deterministic, environment, hashed_seed
from ..task import data
from ..task.verifier import score
from ..models import presets, sampling, scoring
from ..grpo import core, losses, variants
from ..grpo.loop import (CHECKPOINTS_PART, _earlier_attempt, _iterate, _prepare_folder, finish_run, newest_state,
                         read_rollouts, start_loop, warm_start_file)
from ..grpo.variants import Variant
from .larger_run import larger_config
from . import reward_model

JUDGES = {"warm_start": "runs/{preset}/warm_start/model.safetensors", "base": "runs/{preset}/base/model.safetensors"}
BEST_OF_N_DRAWS = 32
BEST_OF_N_SIZES = (1, 2, 4, 8, 16, 32)
CURVE_DRAWS = 4  # validation answers per problem at each checkpoint of a GRPO run
FOOLED_WINDOW = 5  # "early" and "late": a run's first and last 5 iterations
EXAMPLES_KEPT = 6  # fooled validation answers kept per checkpoint
EXAMPLES_PER_KIND = 3  # distinct fooled training responses kept per kind and window


@dataclass(frozen=True)
class Proxy:
    """A learned verifier refitted with `judge`'s features on `share` of the training responses."""

    name: str
    judge: str
    share: float


PROXIES = (Proxy("warm_start_10", "warm_start", 0.1), Proxy("warm_start_30", "warm_start", 0.3),
           Proxy("warm_start_100", "warm_start", 1.0), Proxy("base_10", "base", 0.1), Proxy("base_100", "base", 1.0))


@dataclass(frozen=True)
class Setting:
    """One GRPO run against a proxy."""

    name: str
    proxy: str
    kl: bool  # the exact KL term (coefficient 0.02) on, or off
    iterations: int
    curve_every: int


SETTINGS = (
    Setting("warm_start_100-kl", "warm_start_100", True, 60, 5),
    Setting("warm_start_100-nokl", "warm_start_100", False, 60, 5),
    Setting("warm_start_10-kl", "warm_start_10", True, 60, 5),
    Setting("base_10-kl", "base_10", True, 60, 5),
    Setting("base_100-kl", "base_100", True, 60, 5),
    Setting("base_100-nokl", "base_100", False, 60, 5),
)


def get_proxy(name: str) -> Proxy:
    for p in PROXIES:
        if p.name == name:
            return p
    raise ValueError(f"unknown proxy {name!r}; expected one of {[p.name for p in PROXIES]}")


def get_setting(name: str) -> Setting:
    for s in SETTINGS:
        if s.name == name:
            return s
    raise ValueError(f"unknown setting {name!r}; expected one of {[s.name for s in SETTINGS]}")


def root(preset: str = "tiny") -> Path:
    return preset_folder(preset, "overoptimisation")


def judge_file(preset: str, judge: str) -> Path:
    return REPO_ROOT / JUDGES[judge].format(preset=preset)


def in_subset(problem_id: str, share: float) -> bool:
    """True when the problem's responses are in the `share` subset (nested in share)."""
    value = int.from_bytes(hashlib.sha256(f"overoptimisation/subset/{problem_id}".encode()).digest()[:8], "big")
    return value < share * 2**64


def fooled_kind(verdict, target: int) -> str | None:
    """How a response the proxy paid (but the verifier did not) is wrong: "off_by_one" (a valid
    answer 1 away from the target), "wrong_value" (valid, further away) or "invalid" (no valid
    answer; the verifier's reason says why).  None for a correct response."""
    if verdict.reward == 1:
        return None
    if verdict.valid and verdict.value is not None:
        return "off_by_one" if abs(verdict.value - target) == 1 else "wrong_value"
    return "invalid"


# --- 1. Proxies ---------------------------------------------------------------------------------


def _train_statements() -> dict[str, str]:
    return {r["id"]: r["statement"] for r in data.open_records("statements", "train", "learning")}


def sample_features(preset: str, judge: str, rows: list[dict]) -> torch.Tensor:
    """(N, 5) float64 features of the reward model's responses under `judge`.  The warm start's
    are the reward-model run's own (recorded in its samples); the base's are computed here."""
    if judge == "warm_start":
        return torch.tensor([[r["features"][f] for f in reward_model.FEATURES] for r in rows], dtype=torch.float64)
    model, tokenizer = presets.load(preset, state=judge_file(preset, judge))
    statements = _train_statements()
    prompts = {pid: scoring.build_prompt_ids(tokenizer, statements[pid]) for pid in {r["problem_id"] for r in rows}}
    return reward_model.judge_features(model.eval(), [prompts[r["problem_id"]] for r in rows],
                                       [r["response_ids"] for r in rows], tokenizer.pad_token_id,
                                       tokenizer.eos_token_id)


def fit_proxy(features: torch.Tensor, labels: torch.Tensor, train: torch.Tensor,
              cfg: reward_model.RewardModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(theta, mu, sigma) of the reward model's logistic regression, fitted on the rows `train`.

    features (N, F) float64, labels (N,) float64 in {0, 1}, train (N,) bool.  The same
    standardisation, penalty and Newton steps as `labkit.studies.reward_model.run_reward_model`."""
    mu, sigma = features[train].mean(0), features[train].std(0).clamp_min(1e-12)
    X = torch.cat([torch.ones(int(train.sum()), 1, dtype=torch.float64), (features[train] - mu) / sigma], 1)
    theta, _ = reward_model.fit_logistic(X, labels[train], cfg.l2, cfg.newton_steps)
    return theta, mu, sigma


def proxy_probabilities(features: torch.Tensor, theta: torch.Tensor, mu: torch.Tensor,
                        sigma: torch.Tensor) -> torch.Tensor:
    """(N,) float64 p(correct) = sigmoid(b + w . (x - mu) / sigma)."""
    return torch.sigmoid(theta[0] + ((features - mu) / sigma) @ theta[1:])


def build_proxies(preset: str = "tiny", progress: bool = True) -> dict:
    """Fit every proxy, save it, and measure it on the held-out responses; returns proxies.json."""
    rows = reward_model.read_samples(preset=preset)
    cfg = reward_model.RewardModelConfig(**reward_model.read_manifest(preset=preset)["config"])
    labels = torch.tensor([float(r["label"]) for r in rows], dtype=torch.float64)
    held = torch.tensor([r["held_out"] for r in rows])
    out = {}
    features = {}
    for proxy in PROXIES:
        t0 = time.perf_counter()
        if proxy.judge not in features:
            features[proxy.judge] = sample_features(preset, proxy.judge, rows)
        X = features[proxy.judge]
        train = ~held & torch.tensor([in_subset(r["problem_id"], proxy.share) for r in rows])
        theta, mu, sigma = fit_proxy(X, labels, train, cfg)
        p = proxy_probabilities(X, theta, mu, sigma)
        paid = (p >= cfg.threshold).long().tolist()
        metrics = {side: reward_model.classification_metrics([paid[i] for i in idx], [rows[i]["label"] for i in idx])
                   for side, idx in (("held_out", held.nonzero().flatten().tolist()),
                                     ("train", train.nonzero().flatten().tolist()))}
        path = root(preset) / "proxies" / f"{proxy.name}.safetensors"
        verifier = reward_model.LearnedVerifier(None, 0, 0, theta, mu, sigma, cfg.threshold)
        digest = reward_model.save_verifier(verifier, path)
        judge = judge_file(preset, proxy.judge)
        out[proxy.name] = {**asdict(proxy), "file": str(path.relative_to(REPO_ROOT)), "sha256": digest,
                           "judge_file": str(judge.relative_to(REPO_ROOT)), "judge_sha256": sha256_file(judge),
                           "threshold": cfg.threshold, "train_responses": int(train.sum()),
                           "train_problems": len({rows[i]["problem_id"] for i in train.nonzero().flatten().tolist()}),
                           "metrics": metrics,
                           "weights": {"bias": float(theta[0]),
                                       **dict(zip(reward_model.FEATURES, theta[1:].tolist()))}}
        if progress:
            h = metrics["held_out"]
            print(f"proxy {proxy.name:<15} {int(train.sum()):>5} training responses: held-out precision "
                  f"{h['precision']:.3f}, recall {h['recall']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    write_json(root(preset) / "proxies.json", out)
    return out


def load_proxy(name: str, preset: str = "tiny", judge_model=None, tokenizer=None) -> reward_model.LearnedVerifier:
    """A saved proxy with its judge, both checked against the digests proxies.json records
    (judge_model and tokenizer: an already loaded judge to share between proxies)."""
    from safetensors.torch import load_file

    record = read_json(root(preset) / "proxies.json")[name]
    path, judge = REPO_ROOT / record["file"], REPO_ROOT / record["judge_file"]
    for file, digest in ((path, record["sha256"]), (judge, record["judge_sha256"])):
        if sha256_file(file) != digest:
            raise ArtifactError(f"{file}: SHA-256 differs from the {digest[:16]}... proxies.json records; rebuild "
                                f"with `python -m labkit overoptimisation --overwrite`")
    if judge_model is None or tokenizer is None:
        judge_model, tokenizer = presets.load(preset, state=judge)
        judge_model.requires_grad_(False)
    t = load_file(str(path))
    verifier = reward_model.LearnedVerifier(judge_model.eval(), tokenizer.pad_token_id, tokenizer.eos_token_id,
                                            torch.cat([t["bias"], t["weight"]]),
                                            t["feature_mean"], t["feature_std"], record["threshold"])
    verifier.file_sha256 = record["sha256"]
    return verifier


# --- 2. Best-of-n -------------------------------------------------------------------------------


def best_of_n_weights(scores: list[float], n: int) -> list[float]:
    """P(draw k is the best-of-n pick) over every n-subset of the draws, for each draw k.

    The draws ranked by score ascending (ties: the later draw ranks higher); the i-th lowest
    (1-based) is the subset's maximum with probability C(i - 1, n - 1) / C(N, n)."""
    N = len(scores)
    if not 1 <= n <= N:
        raise ValueError(f"best-of-n with n={n}: n must lie in 1..{N} (the draws per problem)")
    order = sorted(range(N), key=lambda k: (scores[k], k))
    weights = [0.0] * N
    total = math.comb(N, n)
    for i, k in enumerate(order, start=1):
        weights[k] = math.comb(i - 1, n - 1) / total
    return weights


def best_of_n(truth: list[float], scores: list[float], n: int) -> tuple[float, float]:
    """(expected true reward, expected proxy score) of the best-of-n pick among one problem's draws."""
    w = best_of_n_weights(scores, n)
    return sum(a * b for a, b in zip(w, truth)), sum(a * b for a, b in zip(w, scores))


def best_of_n_kl(n: int) -> float:
    """KL(best-of-n || the sampling policy) for a continuous score: log n - (n - 1) / n."""
    return math.log(n) - (n - 1) / n


def validation_problems(tokenizer) -> list[dict]:
    """The 200 validation problems with their prompt ids, in id order."""
    statements = {r["id"]: r for r in data.open_records("statements", "validation", "learning")}
    labels = data.open_records("labels", "validation", "learning")
    return [{"id": r["id"], "problem": r["problem"], "target": r["target"],
             "prompt": scoring.build_prompt_ids(tokenizer, statements[r["id"]]["statement"])} for r in labels]


def run_best_of_n(preset: str = "tiny", progress: bool = True) -> list[dict]:
    """The warm start's 32 draws per validation problem, verified and scored by every proxy."""
    config = larger_config(preset)
    model, tokenizer = presets.load(preset, state=warm_start_file(preset))
    problems = validation_problems(tokenizer)
    D = BEST_OF_N_DRAWS
    t0 = time.perf_counter()
    rollouts = sampling.sample_fast(model.eval(), tokenizer, [p["prompt"] for p in problems for _ in range(D)],
                                    [hashed_seed(f"best-of-n/{p['id']}/{d}") for p in problems for d in range(D)],
                                    problem_ids=[p["id"] for p in problems for _ in range(D)],
                                    max_new_tokens=config.max_new_tokens, batch_size=config.eval_batch_size)
    rows = []
    for k, r in enumerate(rollouts):
        p = problems[k // D]
        v = score(r.text, r.finish_reason, p["problem"], r.tokenization_valid)
        rows.append({"problem_id": p["id"], "draw": k % D, "text": r.text, "finish_reason": r.finish_reason,
                     "tokenization_valid": r.tokenization_valid, "reward": int(v.reward),
                     "reason": v.reason, "value": v.value, "target": p["target"], "kind": fooled_kind(v, p["target"]),
                     "p": {}})
    if progress:
        print(f"best-of-n: {len(rows)} warm-start draws in {time.perf_counter() - t0:.0f} s", flush=True)
    features = {}  # one judge forward per judge; each proxy is then its own logistic regression on them
    for proxy in PROXIES:
        verifier = load_proxy(proxy.name, preset, tokenizer=tokenizer,
                              judge_model=features[proxy.judge][0] if proxy.judge in features else None)
        if proxy.judge not in features:
            features[proxy.judge] = (verifier.judge, reward_model.judge_features(
                verifier.judge, [x.prompt_ids for x in rollouts], [x.response_ids for x in rollouts],
                tokenizer.pad_token_id, tokenizer.eos_token_id))
        p = proxy_probabilities(features[proxy.judge][1], verifier.theta, verifier.mu, verifier.sigma)
        for row, value in zip(rows, p.tolist()):
            row["p"][proxy.name] = value
    write_jsonl(root(preset) / "best_of_n.jsonl.gz", rows)
    return rows


# --- 3. GRPO against a proxy ------------------------------------------------------------------------


def sequence_kl(model, reference, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                rows_per_forward: int = 50) -> torch.Tensor:
    """(N,) float64: sum over each response's tokens of the exact per-prefix KL(model || reference)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(prompts), rows_per_forward):
            batch = scoring.make_batch(prompts[i:i + rows_per_forward], responses[i:i + rows_per_forward], pad_id)
            _, logits = scoring.response_logprobs(model, batch, return_logits=True)  # (b, R, V)
            _, logits_ref = scoring.response_logprobs(reference, batch, return_logits=True)
            kl = losses.exact_prefix_kl(logits, logits_ref).double()  # (b, R)
            out.append((kl * batch.response_mask.to(kl.device).double()).sum(1).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


class ValidationCurves:
    """A GRPO run's checkpoints against its proxy (the `grpo.CheckpointCurves` interface): the same
    200 x 4 seeded validation answers, scored by the verifier and the proxy, and their KL to the start."""

    def __init__(self, loop: core.Loop, proxy: reward_model.LearnedVerifier, total: int, every: int):
        self.loop, self.proxy, self.total, self.every = loop, proxy, total, every
        self.problems = validation_problems(loop.tokenizer)

    def measure(self, iteration: int) -> dict:
        loop, D = self.loop, CURVE_DRAWS
        prompts = [p["prompt"] for p in self.problems for _ in range(D)]
        rollouts = sampling.sample_fast(
            loop.model, loop.tokenizer, prompts,
            [hashed_seed(f"overoptimisation/{p['id']}/{d}") for p in self.problems for d in range(D)],
            problem_ids=[p["id"] for p in self.problems for _ in range(D)],
            max_new_tokens=loop.config.max_new_tokens, batch_size=loop.config.eval_batch_size)
        responses = [r.response_ids for r in rollouts]
        yes, p = self.proxy.rewards(prompts, responses)
        kl = sequence_kl(loop.model, loop.reference, prompts, responses, loop.tokenizer.pad_token_id)
        true_counts, proxy_counts, kinds, examples = [], [], {}, []
        for k, problem in enumerate(self.problems):
            t = c = 0
            for j in range(k * D, (k + 1) * D):
                r = rollouts[j]
                v = score(r.text, r.finish_reason, problem["problem"], r.tokenization_valid)
                t, c = t + int(v.reward), c + int(yes[j] > 0)
                kind = fooled_kind(v, problem["target"])
                if yes[j] > 0 and kind is not None:
                    kinds[kind] = kinds.get(kind, 0) + 1
                    if len(examples) < EXAMPLES_KEPT:
                        examples.append({"problem_id": problem["id"], "target": problem["target"], "text": r.text,
                                         "reason": v.reason, "kind": kind, "p": float(p[j])})
            true_counts.append(t)
            proxy_counts.append(c)
        n = len(rollouts)
        return {"iteration": iteration, "true_success": sum(true_counts) / n, "proxy_yes": sum(proxy_counts) / n,
                "proxy_p": float(p.mean()), "sequence_kl": float(kl.mean()),
                "tokens_per_response": sum(len(x) for x in responses) / n, "problems": len(self.problems),
                "draws": D, "true_counts": true_counts, "proxy_counts": proxy_counts,
                "fooled": dict(sorted(kinds.items())), "fooled_examples": examples,
                # every answer, so that an outsider can re-score the truth: texts[k x D + d] is draw d on
                # validation problem k, in the order of problem_ids (the labels are in data/)
                "problem_ids": [p["id"] for p in self.problems], "texts": [r.text for r in rollouts],
                "finish_reasons": [r.finish_reason for r in rollouts],
                "undecodable": [j for j, r in enumerate(rollouts) if not r.tokenization_valid]}

    def maybe_measure(self, folder: RunFolder, iteration: int, at_start: bool = False) -> float:
        if at_start and iteration != 0:
            return 0.0
        if not (iteration % self.every == 0 or iteration == self.total):
            return 0.0
        t0 = time.perf_counter()
        folder.append(CHECKPOINTS_PART, [self.measure(iteration)])
        return time.perf_counter() - t0


def grpo_dir(preset: str, setting: str) -> Path:
    return root(preset) / "grpo" / setting


def setting_file(preset: str, setting: str) -> Path:
    return root(preset) / "settings" / f"{setting}.jsonl.gz"  # one row; gzip: 5 KB, not 90


def _fooled_in_window(rows: list[dict], iterations: range, labels: dict[str, dict]) -> dict:
    """Counts by kind and examples (the first EXAMPLES_PER_KIND distinct texts of each kind) of the
    training rollouts the proxy paid and the verifier did not (each re-verified from its text, to
    learn its value)."""
    chosen = [r for r in rows if r["iteration"] in iterations]
    kinds, examples = {}, []
    for r in chosen:
        if r["optimised_reward"] >= 1.0 and r["reward"] == 0.0:
            label = labels[r["problem_id"]]
            kind = fooled_kind(score(r["text"], r["finish_reason"], label["problem"], r["tokenization_valid"]),
                               label["target"])
            kinds[kind] = kinds.get(kind, 0) + 1
            seen = [e for e in examples if e["kind"] == kind]
            if len(seen) < EXAMPLES_PER_KIND and all((e["problem_id"], e["text"]) != (r["problem_id"], r["text"])
                                                     for e in seen):
                examples.append({"iteration": r["iteration"], "problem_id": r["problem_id"],
                                 "target": label["target"], "text": r["text"], "reason": r["reason"],
                                 "kind": kind})
    return {"iterations": [iterations.start, iterations.stop - 1], "rollouts": len(chosen),
            "paid": sum(1 for r in chosen if r["optimised_reward"] >= 1.0),
            "true": sum(1 for r in chosen if r["reward"] == 1.0), "fooled": dict(sorted(kinds.items())),
            "examples": examples}


def run_setting(setting: Setting, preset: str = "tiny", progress: bool = False, threads: int = 1, *,
                resume: bool = False, restart: bool = False) -> dict:
    """Train one setting's GRPO run, then write its thin record settings/<name>.jsonl.gz.

    The run's life is the run skeleton's (`labkit.lab.skeleton`, through the GRPO loop): a folder holding
    an unfinished attempt (a Ctrl-C, a kill) is refused unless `resume` (continue from its newest state)
    or `restart` (delete it); Ctrl-C saves a state and says how to continue."""
    torch.set_num_threads(threads)
    folder_path = grpo_dir(preset, setting.name)
    config = larger_config(preset).with_overrides(grpo_iterations=setting.iterations, checkpoint_every=0)
    variant = Variant(reward="learned", kl="exact" if setting.kl else "none")
    began = time.perf_counter()
    if not RunFolder(folder_path).is_finished():
        with holding(RunFolder(folder_path)) as folder:
            resume_from = newest_state(folder) if resume else None
            attempt = _earlier_attempt(folder)
            if resume and resume_from is None and attempt:
                raise UnfinishedRunError(f"{display_path(folder.path)} holds an unfinished attempt ({attempt}) but no "
                                         "saved state to resume from: pass --restart to delete it and start afresh")
            proxy = load_proxy(setting.proxy, preset)  # the proxy this run optimises (reward "learned")
            loop = start_loop(config, config.G, setting.iterations, warm_start_file(preset),
                              "fast", "cpu", variants.resolve(variant, config, proxy), shared_prompts=True)
            loop.identity.update(proxy=setting.proxy)
            first, first_in_folder = _prepare_folder(folder, loop, resume_from, restart, None)
            curves = ValidationCurves(loop, proxy, setting.iterations, setting.curve_every)
            _iterate(folder, loop, first, setting.iterations, (), "fast", progress, curves)
            finish_run(folder, loop, first_in_folder, resume_from,
                       {"iterations_run": [first, setting.iterations], "state_files": [],
                        "seconds": time.perf_counter() - began})
    folder = RunFolder(folder_path)
    history = read_json(folder_path / "history.json")
    rows = read_rollouts(folder_path)
    labels = {r["id"]: r for r in data.open_records("labels", "train", "learning")}
    manifest = read_json(folder_path / "manifest.json")
    record = {
        "setting": asdict(setting), "proxy": read_json(root(preset) / "proxies.json")[setting.proxy],
        "config": {k: config.to_dict()[k] for k in ("prompts_per_iteration", "G", "grpo_lr", "kl_coef")},
        "variant": variant.to_dict(),
        "curves": folder.read_part(CHECKPOINTS_PART),
        "training": [{"iteration": h["iteration"], "true": h["reward"], "proxy": h["optimised_reward"],
                      "kl_per_token": h["kl"]} for h in history],
        "early": _fooled_in_window(rows, range(1, FOOLED_WINDOW + 1), labels),
        "late": _fooled_in_window(rows, range(setting.iterations - FOOLED_WINDOW + 1, setting.iterations + 1),
                                  labels),
        "run": {"folder": _shown(folder_path), "final_digest": manifest["final_digest"],
                "rollouts": manifest["rollouts"], "seconds": manifest["seconds"],
                "torch_threads": manifest["identity"]["torch_threads"]},
    }
    write_jsonl(setting_file(preset, setting.name), [record])
    return record


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _setting_worker(args) -> tuple[str, float]:
    name, preset, threads, resume, restart = args
    t0 = time.perf_counter()
    with deterministic("cpu", warn_only=True):
        run_setting(get_setting(name), preset, threads=threads, resume=resume, restart=restart)
    return name, time.perf_counter() - t0


# --- 4. The step ---------------------------------------------------------------------------------------


def run_all(preset: str = "tiny", *, only: tuple[str, ...] | None = None, workers: int = 2, threads: int = 1,
            overwrite: bool = False, progress: bool = True, resume: bool = False, restart: bool = False) -> dict:
    """Proxies, best-of-n and the GRPO settings (each in a worker process, one thread each: `labkit.lab.workers`,
    so that no worker outlives the command); then manifest.json with every file's digest.  Finished parts are
    kept unless `overwrite`.  resume, restart: for each setting whose run holds an unfinished attempt
    (`run_setting`; without either, such a setting is refused in one line, before any work)."""
    from ..lab.workers import each_result

    if resume and restart:
        raise ValueError("--resume continues an unfinished attempt and --restart deletes it: pass one of them")
    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: the over-optimisation runs exist for the tiny preset only")
    for name in only or ():
        get_setting(name)  # an unknown name is refused before any work
    out = root(preset)
    if (out / "manifest.json").is_file() and not overwrite:  # a built step is evidence: never rewritten quietly
        raise FileExistsError(f"{out} is built (manifest.json); pass --overwrite to rebuild it")
    if overwrite:
        (out / "manifest.json").unlink(missing_ok=True)
    names = [s.name for s in SETTINGS if (not only or s.name in only)
             and (overwrite or not setting_file(preset, s.name).is_file())]
    for name in names if not (overwrite or resume or restart) else ():  # refused before any work, by name
        refuse_earlier_attempt(RunFolder(grpo_dir(preset, name)), _earlier_attempt(RunFolder(grpo_dir(preset, name))),
                               False, False)
    times_file = out / "times.json"  # seconds of each part, kept across calls (a part runs once)
    times = read_json(times_file) if times_file.is_file() and not overwrite else {}

    def timed(part: str, seconds: float) -> None:
        times[part] = seconds
        write_json(times_file, times)

    if overwrite or not (out / "proxies.json").is_file():
        t0 = time.perf_counter()
        build_proxies(preset, progress)
        timed("proxies", time.perf_counter() - t0)
    if overwrite or not (out / "best_of_n.jsonl.gz").is_file():
        t0 = time.perf_counter()
        run_best_of_n(preset, progress)
        timed("best_of_n", time.perf_counter() - t0)
    if overwrite:
        import shutil

        for name in names:
            shutil.rmtree(grpo_dir(preset, name), ignore_errors=True)
    command = f"python -m labkit overoptimisation --preset {preset} --resume"
    jobs = [(n, preset, threads, resume, restart) for n in names]
    for _, (name, seconds) in each_result(_setting_worker, jobs, workers, what="over-optimisation runs",
                                          command=command):
        if seconds > 60 or f"grpo/{name}" not in times:  # a record rebuilt from a finished run keeps its time
            timed(f"grpo/{name}", seconds)
        if progress:
            print(f"overoptimisation: {name} done in {seconds:.0f} s", flush=True)
    if all(setting_file(preset, s.name).is_file() for s in SETTINGS):
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                       if p.is_file() and not p.relative_to(out).parts[0] == "grpo" and p.name != "manifest.json")
        write_json(out / "manifest.json", {
            "step": "overoptimisation", "preset": preset, "files": {f: sha256_file(out / f) for f in files},
            "proxies": [asdict(p) for p in PROXIES], "settings": [asdict(s) for s in SETTINGS],
            "best_of_n": {"draws": BEST_OF_N_DRAWS, "sizes": list(BEST_OF_N_SIZES)},
            "times": times, "workers": workers, "threads_per_worker": threads,
            "code_sha256": code_digests(), "data_sha256": data_digests(), "environment": environment("cpu")})
    return times


def is_built(preset: str = "tiny") -> bool:
    return (root(preset) / "manifest.json").is_file()


def read_file(name: str, preset: str = "tiny"):
    """A committed file of the step (json or jsonl.gz), checked against the digest manifest.json records."""
    out = root(preset)
    manifest = read_json(out / "manifest.json")
    if name not in manifest["files"]:
        raise FileNotFoundError(f"{out / name}: not a file of the over-optimisation step ({sorted(manifest['files'])})")
    if sha256_file(out / name) != manifest["files"][name]:
        raise ArtifactError(f"{out / name}: SHA-256 differs from the one {out / 'manifest.json'} records; rebuild "
                            "with `python -m labkit overoptimisation --overwrite`")
    return read_jsonl(out / name) if name.endswith(".jsonl.gz") else read_json(out / name)


def read_setting(name: str, preset: str = "tiny") -> dict:
    """A GRPO setting's record (its one row)."""
    get_setting(name)
    [record] = read_file(f"settings/{name}.jsonl.gz", preset)
    return record


def read_proxies(preset: str = "tiny") -> dict:
    return read_file("proxies.json", preset)


def read_best_of_n(preset: str = "tiny") -> list[dict]:
    return read_file("best_of_n.jsonl.gz", preset)
