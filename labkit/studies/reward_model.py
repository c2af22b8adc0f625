"""A learned verifier: a reward model trained on the exact verifier's labels (chapter 10).

    python -m labkit reward-model --preset tiny        # -> runs/tiny/reward_model/

Why.  A verifiable reward is exact; most rewards in practice are learned, and a learned reward
can be fooled.  This module builds one for StockArithmetic from the verifier itself, so that the
proxy (this model's yes/no) and the truth (the verifier's) can be logged side by side.

The data (learning phase: train problems only).  The warm start and the SFT policy each answer
every one of the 1,000 train problems `draws_per_problem` times at temperature 1 (seeded, the
fast sampler), and `labkit.task.verifier` labels every response 1 (complete, valid, correct) or 0.  A
problem is held out when SHA-256("reward-model/<id>") falls in the last `held_out_share` of its
range: all responses to a problem lie on one side, so held-out accuracy is on unseen statements.

The model: a classifier on a frozen judge's scores.  The judge is the warm start; one
teacher-forced forward of it over (prompt, response) gives the response's token log-probs
logp_1..logp_n, and five features:

    x = (sum logp, min logp, mean logp, n / max_new_tokens, 1 if the response ended with EOS)
    p(correct) = sigmoid(w . (x - mu) / sigma + b)     logistic regression, float64, exact Newton
                                                       steps, L2 penalty `l2` on w
    proxy reward = 1 if p(correct) >= threshold else 0   a learned yes/no in the verifier's place

mu and sigma are the training features' mean and std.  Why not a fine-tuned scalar head?  It was
tried first (the tiny base and the warm start as backbones, the last token's hidden state or the
mean over the response, lr 1e-4 to 1e-3, 3 to 6 epochs on these 3,224 responses): it stayed at
the majority prior, held-out accuracy 61-65% with recall 0.95-1.0, i.e. it paid almost every
response.  Judging the arithmetic from the text is more than that budget can learn; the judge's
own confidence already separates right from wrong, and a classifier on it is what the lab keeps.
What that proxy rewards (the judge's confidence, not the value's correctness) is exactly what a
policy can learn to give it: chapter 10 shows how.

Files: `samples.jsonl.gz` (every response with its label, reason, side and features),
`model.safetensors` (w, b, mu, sigma; digest recorded), `history.json` (the Newton steps),
`manifest.json` (config, the judge's file and digest, data and code digests, precision and
recall on the held-out and training responses), FINISHED.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..lab.runs import REPO_ROOT, RunFolder, preset_folder, read_jsonl, sha256_file, write_json, write_jsonl
from ..lab.runtime import code_digests, data_digests, deterministic, environment, hashed_seed, seed_everything
from ..task import data
from ..config import RewardModelConfig
from ..models import presets, sampling, scoring
from ..eval import evaluate

POLICIES = ("warm_start", "sft")  # whose responses the reward model learns to judge
JUDGE = "warm_start"  # the frozen model whose scores are the classifier's input
FEATURES = ("sum_logprob", "min_logprob", "mean_logprob", "length_share", "ended_with_eos")
SAMPLES_FILE = "samples.jsonl.gz"
MODEL_FILE = "model.safetensors"
SCORE_BATCH = 64  # rows per judge forward


def is_held_out(problem_id: str, share: float) -> bool:
    """True for the problems kept out of training: a fixed hash rule, no state."""
    value = int.from_bytes(hashlib.sha256(f"reward-model/{problem_id}".encode()).digest()[:8], "big")
    return value >= (1.0 - share) * 2**64


def sample_seed(policy: str, problem_id: str, draw: int) -> int:
    """The response's own seed: SHA-256("reward-model/<policy>/<id>/<draw>"), 62 bits."""
    return hashed_seed(f"reward-model/{policy}/{problem_id}/{draw}")


# --- 1. Features: the frozen judge's scores of a response ----------------------------------------


@torch.no_grad()
def judge_features(judge, prompts: list[list[int]], responses: list[list[int]], pad_id: int, eos_id: int,
                   max_new_tokens: int = scoring.MAX_NEW_TOKENS) -> torch.Tensor:
    """(N, 5) float64: FEATURES of each (prompt, response), one teacher-forced judge forward per batch.

    logp (N, R) is the judge's log-prob of each response token (0 beyond the response); the
    min is over the response's own tokens only."""
    out = []
    for i in range(0, len(prompts), SCORE_BATCH):
        batch = scoring.make_batch(prompts[i:i + SCORE_BATCH], responses[i:i + SCORE_BATCH], pad_id)
        logp, _ = scoring.response_logprobs(judge, batch)  # (B, R)
        mask = batch.response_mask.to(logp.device) > 0  # (B, R)
        n = batch.response_lengths.to(logp.device).double()  # (B,)
        total = logp.double().sum(1)
        lowest = logp.double().masked_fill(~mask, float("inf")).min(1).values
        ended = torch.tensor([float(r[-1] == eos_id) for r in responses[i:i + SCORE_BATCH]], dtype=torch.float64)
        out.append(torch.stack([total, lowest, total / n, n / max_new_tokens, ended.to(logp.device)], 1).cpu())
    return torch.cat(out) if out else torch.zeros(0, len(FEATURES), dtype=torch.float64)


# --- 2. The classifier: logistic regression by Newton's method -----------------------------------


def logistic_loss(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """Mean binary cross-entropy of sigmoid(X theta) against y, + l2/2 |w|^2 (theta = (b, w)).

    X: (N, 1 + F) float64 with a leading column of ones; y: (N,) float64 in {0, 1}."""
    z = X @ theta  # (N,)
    return torch.nn.functional.softplus(z).mean() - (y * z).mean() + 0.5 * l2 * (theta[1:] ** 2).sum()


def fit_logistic(X: torch.Tensor, y: torch.Tensor, l2: float, steps: int) -> tuple[torch.Tensor, list[dict]]:
    """theta (1 + F,) float64 minimising `logistic_loss`, and the log of the Newton steps.

    Newton: theta <- theta - H^-1 g, with g = X^T (p - y) / N + l2 w and
    H = X^T diag(p (1 - p)) X / N + l2 I (no penalty on the bias).  The loss is convex and
    H is positive definite (l2 > 0), so the steps converge, in a few dozen at most."""
    N, D = X.shape
    theta = torch.zeros(D, dtype=torch.float64)
    ridge = torch.full((D,), l2, dtype=torch.float64)
    ridge[0] = 0.0
    log = []
    for step in range(steps):
        p = torch.sigmoid(X @ theta)  # (N,)
        gradient = X.T @ (p - y) / N + ridge * theta  # (D,)
        hessian = (X.T * (p * (1 - p))) @ X / N + torch.diag(ridge)  # (D, D)
        move = torch.linalg.solve(hessian, gradient)
        theta = theta - move
        log.append({"step": step + 1, "loss": float(logistic_loss(theta, X, y, l2)),
                    "step_norm": float(move.norm()), "grad_norm": float(gradient.norm())})
        if float(move.norm()) < 1e-12:
            break
    return theta, log


def classification_metrics(predicted: list[int], labels: list[int]) -> dict:
    """Counts and rates of the proxy's yes/no against the verifier's labels (1 = correct).

    precision = TP / (TP + FP): of the responses the proxy pays, the share that are correct;
    recall    = TP / (TP + FN): of the correct responses, the share the proxy pays.
    A rate with an empty denominator is None."""
    if len(predicted) != len(labels):
        raise ValueError(f"{len(predicted)} predictions for {len(labels)} labels; they pair up one to one")
    tp = sum(1 for p, y in zip(predicted, labels) if p and y)
    fp = sum(1 for p, y in zip(predicted, labels) if p and not y)
    fn = sum(1 for p, y in zip(predicted, labels) if not p and y)
    tn = len(labels) - tp - fp - fn
    ratio = lambda a, b: a / b if b else None  # noqa: E731
    return {"n": len(labels), "tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": ratio(tp, tp + fp),
            "recall": ratio(tp, tp + fn), "accuracy": ratio(tp + tn, len(labels)),
            "positive_share": ratio(sum(labels), len(labels))}


# --- 3. The learned verifier: judge + classifier --------------------------------------------------


class LearnedVerifier:
    """p(correct) and the proxy's yes/no for (prompt, response) token ids."""

    def __init__(self, judge, pad_id: int, eos_id: int, theta: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor,
                 threshold: float):
        self.judge, self.pad_id, self.eos_id = judge, pad_id, eos_id
        self.theta, self.mu, self.sigma, self.threshold = theta, mu, sigma, threshold
        self.file_sha256: str | None = None  # the classifier file's digest, set by load_verifier

    def probabilities(self, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
        """(N,) float64 p(correct)."""
        x = (judge_features(self.judge, prompts, responses, self.pad_id, self.eos_id) - self.mu) / self.sigma
        return torch.sigmoid(self.theta[0] + x @ self.theta[1:])

    def rewards(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """((N,) float32 proxy rewards in {0, 1}, (N,) float64 p(correct))."""
        p = self.probabilities(prompts, responses)
        return (p >= self.threshold).float(), p

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"bias": self.theta[:1].clone(), "weight": self.theta[1:].clone(), "feature_mean": self.mu.clone(),
                "feature_std": self.sigma.clone()}


def save_verifier(verifier: LearnedVerifier, path: Path) -> str:
    """Write the classifier's tensors as safetensors (sorted header, atomic); returns its SHA-256."""
    from safetensors.torch import save

    from ..lab.runs import atomic_write_bytes

    data_bytes = presets.canonical_safetensors(save(verifier.tensors(), metadata={"format": "pt"}))
    atomic_write_bytes(path, data_bytes)
    return hashlib.sha256(data_bytes).hexdigest()


def finished_folder(preset: str, run_dir: str | Path | None = None) -> RunFolder:
    """The learned verifier's run folder, refused with the command that builds it unless finished."""
    folder = RunFolder(run_dir or default_run_dir(preset))
    if not folder.is_finished():
        raise FileNotFoundError(f"no finished reward model at {folder}; build it with "
                                f"`python -m labkit reward-model --preset {preset}`")
    return folder


def load_verifier(preset: str, run_dir: str | Path | None = None, device: str | None = None) -> LearnedVerifier:
    """The finished learned verifier: its classifier file and its judge, each checked against the
    digest its run recorded, the judge frozen in eval mode."""
    from safetensors.torch import load_file

    from ..lab.runs import ArtifactError, check_recorded_digest, recorded_sha256

    folder = finished_folder(preset, run_dir)
    manifest = folder.manifest()
    recorded = recorded_sha256(folder / MODEL_FILE)
    if recorded is None:
        raise ArtifactError(f"{folder / MODEL_FILE}: its run records no digest for it; rebuild it with "
                            f"`python -m labkit reward-model --preset {preset} --overwrite`")
    check_recorded_digest(folder / MODEL_FILE)
    judge_path = REPO_ROOT / manifest["judge"]["file"]
    if sha256_file(judge_path) != manifest["judge"]["sha256"]:
        raise ValueError(f"{judge_path} is not the judge {folder} was trained with (SHA-256 differs from "
                         f"{manifest['judge']['sha256'][:16]}...); rebuild it with `python -m labkit reward-model "
                         f"--preset {preset} --overwrite`")
    judge, tokenizer = presets.load(preset, state=judge_path, device=device)
    judge.requires_grad_(False)
    t = load_file(str(folder / MODEL_FILE))
    verifier = LearnedVerifier(judge.eval(), tokenizer.pad_token_id, tokenizer.eos_token_id,
                               torch.cat([t["bias"], t["weight"]]), t["feature_mean"], t["feature_std"],
                               manifest["config"]["threshold"])
    verifier.file_sha256 = recorded[0]  # what check_recorded_digest just matched
    return verifier


# --- 4. The run: sample, label, split, fit, measure, save -----------------------------------------


def sample_responses(preset: str, cfg: RewardModelConfig, problems: list[dict], progress: bool = True) -> list[dict]:
    """One row per response: each policy answers each problem `draws_per_problem` times, verified."""
    rows = []
    for policy in POLICIES:
        model, tokenizer = presets.load(preset, state=evaluate.policy_state_file(preset, policy))
        items = [(p["id"], scoring.build_prompt_ids(tokenizer, p["statement"]), p["problem"]) for p in problems]
        seeds = [sample_seed(policy, p["id"], d) for p in problems for d in range(cfg.draws_per_problem)]
        t0 = time.perf_counter()
        groups = sampling.sample_groups(model, tokenizer, items, cfg.draws_per_problem, seeds, sampler="fast",
                                        rollout_ids=[f"rm-{policy}-{p['id']}-{d}" for p in problems
                                                     for d in range(cfg.draws_per_problem)])
        for g in groups:
            for d, (r, v) in enumerate(zip(g.rollouts, g.verdicts)):
                rows.append({"policy": policy, "problem_id": g.problem_id, "draw": d, "seed": r.seed,
                             "text": r.text, "finish_reason": r.finish_reason, "response_ids": list(r.response_ids),
                             "label": int(v.reward), "reason": v.reason,
                             "held_out": is_held_out(g.problem_id, cfg.held_out_share)})
        if progress:
            print(f"reward model data: {len(groups) * cfg.draws_per_problem} responses of {policy} in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def default_run_dir(preset: str) -> Path:
    return preset_folder(preset, "reward_model")


def model_file(preset: str) -> Path:
    """The finished learned verifier's classifier file (what a learned-reward run's identity names)."""
    return finished_folder(preset) / MODEL_FILE


def run_reward_model(preset: str = "tiny", run_dir: str | Path | None = None, *, cfg: RewardModelConfig | None = None,
                     limit: int | None = None, overwrite: bool = False, progress: bool = True) -> dict:
    """Sample, label, split, fit and save the learned verifier; returns its manifest.

    limit: use only the first `limit` train problems (tests); None = all 1,000."""
    cfg = cfg or RewardModelConfig()
    folder = RunFolder(run_dir or default_run_dir(preset)).open_for_writing(overwrite)
    folder.clear((SAMPLES_FILE, MODEL_FILE, "history.json", "manifest.json"))
    began = time.perf_counter()
    seed_everything(cfg.seed)
    statements = data.open_records("statements", "train", "learning")
    labels = {r["id"]: r for r in data.open_records("labels", "train", "learning")}
    problems = [{**s, **labels[s["id"]]} for s in statements][:limit]
    judge_path = evaluate.policy_state_file(preset, JUDGE)
    with deterministic("cpu", warn_only=True):
        rows = sample_responses(preset, cfg, problems, progress)
        judge, tokenizer = presets.load(preset, state=judge_path)
        prompts = {p["id"]: scoring.build_prompt_ids(tokenizer, p["statement"]) for p in problems}
        features = judge_features(judge, [prompts[r["problem_id"]] for r in rows], [r["response_ids"] for r in rows],
                                  tokenizer.pad_token_id, tokenizer.eos_token_id)  # (N, F)
    for r, x in zip(rows, features.tolist()):
        r["features"] = dict(zip(FEATURES, x))
    side = torch.tensor([r["held_out"] for r in rows])
    y = torch.tensor([float(r["label"]) for r in rows], dtype=torch.float64)
    if bool(side.all()) or not bool(side.any()):
        raise ValueError(f"{int((~side).sum())} training and {int(side.sum())} held-out responses: both sides "
                         "need some (use more problems)")
    mu, sigma = features[~side].mean(0), features[~side].std(0).clamp_min(1e-12)
    X = torch.cat([torch.ones(len(rows), 1, dtype=torch.float64), (features - mu) / sigma], 1)  # (N, 1 + F)
    theta, history = fit_logistic(X[~side], y[~side], cfg.l2, cfg.newton_steps)
    verifier = LearnedVerifier(judge, tokenizer.pad_token_id, tokenizer.eos_token_id, theta, mu, sigma, cfg.threshold)
    p = torch.sigmoid(X @ theta)
    for r, value in zip(rows, p.tolist()):
        r["p_correct"] = value
        r["proxy"] = int(value >= cfg.threshold)

    def metrics(chosen: list[dict]) -> dict:
        return classification_metrics([r["proxy"] for r in chosen], [r["label"] for r in chosen])

    final = {"held_out": metrics([r for r in rows if r["held_out"]]),
             "train": metrics([r for r in rows if not r["held_out"]]),
             "held_out_by_policy": {policy: metrics([r for r in rows if r["held_out"] and r["policy"] == policy])
                                    for policy in POLICIES}}
    write_jsonl(folder / SAMPLES_FILE, rows)
    digest = save_verifier(verifier, folder / MODEL_FILE)
    write_json(folder / "history.json", history)
    manifest = {
        "step": "reward_model", "preset": preset, "config": asdict(cfg), "limit": limit,
        "features": list(FEATURES),
        "weights": {"bias": float(theta[0]), **{name: float(w) for name, w in zip(FEATURES, theta[1:].tolist())}},
        "judge": {"policy": JUDGE, "file": str(judge_path.relative_to(REPO_ROOT)), "sha256": sha256_file(judge_path)},
        "sources": {policy: str(evaluate.policy_state_file(preset, policy).relative_to(REPO_ROOT)) for policy in POLICIES},
        "responses": {"total": len(rows), "train": int((~side).sum()), "held_out": int(side.sum()),
                      "held_out_problems": len({r["problem_id"] for r in rows if r["held_out"]})},
        "metrics": final,
        "data_sha256": data_digests(), "code_sha256": code_digests(), "environment": environment("cpu"),
        "times": {"total_seconds": time.perf_counter() - began},
    }
    folder.register(MODEL_FILE, digest)
    for name in (SAMPLES_FILE, "history.json"):
        folder.register(name)
    manifest["ledger"] = folder.ledger()
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"held_out_precision": final["held_out"]["precision"],
                          "held_out_recall": final["held_out"]["recall"]})
    return manifest


def read_samples(run_dir: str | Path | None = None, preset: str = "tiny") -> list[dict]:
    """The labelled responses of a finished reward-model run (checked against its ledger)."""
    folder = RunFolder(run_dir or default_run_dir(preset))
    folder.check_file(SAMPLES_FILE)
    return read_jsonl(folder / SAMPLES_FILE)


def read_manifest(run_dir: str | Path | None = None, preset: str = "tiny") -> dict:
    """The learned verifier run's manifest (its config, held-out metrics and file digests)."""
    return RunFolder(run_dir or default_run_dir(preset)).manifest()
