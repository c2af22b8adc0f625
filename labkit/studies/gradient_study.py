"""How good is a policy-gradient estimate?  Two measurements beside the runs (issue 40, chapters 2-3).

1. The policy-gradient identity, exactly (`identity_case`, `score_function_errors`).  A one-step
   game small enough to enumerate: the warm start's next token where its answer's number begins
   (after `{"final_stock": `), reward 1 for the token the right answer begins with.  With logits z
   and pi = softmax(z), the expected reward is J = sum_a pi_a r_a and its exact gradient is

       dJ/dz = pi * (r - J)                                      (V,)

   The score-function (REINFORCE) estimate from N sampled tokens a_1..a_N is

       g_hat = 1/N sum_i (r(a_i) - b_i) (onehot(a_i) - pi)       since d log pi_a / dz = onehot(a) - pi

   With no baseline (b = 0) or a leave-one-out baseline (b_i = the mean of the other N - 1
   rewards) it is unbiased, its error falls as 1/sqrt(N), and the baseline makes it smaller.  The
   group mean with itself included (GRPO's centring) gives (N-1)/N of the gradient: the same
   direction.  This is the logits' gradient; the parameters' is it times the network's Jacobian.

2. The estimator's noise at the warm start, in weight space (`gradient_noise`): many independent
   batches of P prompts x G rollouts from the warm start, each batch's gradient of the first
   update's surrogate (the ratio is 1 there, so its gradient is the policy gradient) under each
   advantage scheme of ADVANTAGE_SCHEMES, against a large-batch reference of the unbiased
   leave-one-out estimate: variance, cosine with the reference, signal-to-noise.

`python -m labkit gradient-study` runs both on the warm start and writes
runs/<preset>/gradient_study/results.json (the cache step `gradient_study`; seconds-long cells read it).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..grpo import losses, variants

ADVANTAGE_SCHEMES = ("none", "mean", "mean_std", "leave_one_out")
# each scheme as the loop's switches: (variants' baseline, scale_by_std)
SCHEME_SETTINGS = {"none": ("none", False), "mean": ("group_mean", False), "mean_std": ("group_mean", True),
                   "leave_one_out": ("leave_one_out", False)}
# none           A = r                         REINFORCE on the raw 0/1 reward
# mean           A = r - mean(r)               Dr. GRPO (the group mean, itself included)
# mean_std       A = (r - mean) / (std + eps)  GRPO
# leave_one_out  A = r - mean of the others    RLOO: = G / (G - 1) (r - mean)
IDENTITY_SIZES = (4, 16, 64, 256, 1024)
IDENTITY_TRIALS = 2000
NOISE_PROMPTS, NOISE_G = 4, 4  # the protocol's batch: 4 prompts x G = 4
NOISE_BATCHES = 128  # measured batches
NOISE_CHUNKS = 16  # the measured batches in this many equal chunks: the jackknife's units (`snr_with_interval`)
REFERENCE_BATCHES = 128  # the reference's batches (2,048 rollouts), apart from the measured ones
STUDY_SEED = 9090
UNSURE = (0.3, 0.7)  # the identity's second case: the first pool problem whose right first digit has p in here


def scheme_advantages(rewards: torch.Tensor, scheme: str, eps: float = 1e-8) -> torch.Tensor:
    """(P, G) advantages of (P, G) rewards under `scheme` (ADVANTAGE_SCHEMES), float64, detached."""
    if scheme not in ADVANTAGE_SCHEMES:
        raise ValueError(f"advantage scheme {scheme!r}: expected one of {ADVANTAGE_SCHEMES}")
    # the loop's own table: each scheme is a (baseline, scale_by_std) setting of `labkit.grpo.variants`
    baseline, scale_by_std = SCHEME_SETTINGS[scheme]
    return variants.ADVANTAGE_TABLE[baseline](rewards, eps, scale_by_std)


# -- 1. The identity, on a game small enough to enumerate ---------------------------------------------


def exact_gradient(probs: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """dJ/dz = pi * (r - J) for a categorical policy pi = softmax(z): (V,) from (V,) and (V,)."""
    J = (probs * rewards).sum()
    return probs * (rewards - J)


def score_average(probs: torch.Tensor, samples: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mean_i w_i (onehot(a_i) - pi): the logits' gradient of a loss that weighs each sampled token's
    log-probability by w_i (d log pi_a / dz = onehot(a) - pi).  probs (V,); samples, weights (trials, N);
    returns (trials, V), float64: the scatter of w_i at a_i over N, minus mean(w) pi."""
    weights = weights.to(torch.float64)
    g = torch.zeros(samples.shape[0], probs.numel(), dtype=torch.float64).scatter_add_(1, samples, weights)
    return g / samples.shape[1] - weights.mean(dim=1, keepdim=True) * probs.to(torch.float64)


def score_function_estimates(probs: torch.Tensor, rewards: torch.Tensor, N: int, trials: int, scheme: str,
                             generator: torch.Generator) -> torch.Tensor:
    """`trials` independent estimates of dJ/dz from N samples each, advantages by `scheme`: (trials, V).

    g_hat = 1/N sum_i A_i (onehot(a_i) - pi) (`score_average`)."""
    samples = torch.multinomial(probs.expand(trials, -1), N, replacement=True, generator=generator)  # (trials, N)
    A = scheme_advantages(rewards[samples], scheme)  # (trials, N): one "group" per trial
    return score_average(probs, samples, A)


def score_function_errors(probs: torch.Tensor, rewards: torch.Tensor, sizes=IDENTITY_SIZES,
                          trials: int = IDENTITY_TRIALS, seed: int = STUDY_SEED,
                          schemes=("none", "mean", "leave_one_out")) -> dict:
    """For each scheme and N: the root-mean-square error of the estimate against the exact gradient,
    and the norm of its bias (its mean over the trials minus the exact gradient); also the exact
    gradient's norm.  {"exact_norm", "J", "sizes", scheme: {"rms_error": [...], "bias": [...]}}."""
    probs, rewards = probs.to(torch.float64), rewards.to(torch.float64)
    exact = exact_gradient(probs, rewards)
    out = {"exact_norm": float(exact.norm()), "J": float((probs * rewards).sum()), "sizes": list(sizes)}
    for scheme in schemes:
        generator = torch.Generator().manual_seed(seed)
        rms, bias = [], []
        for N in sizes:
            g = score_function_estimates(probs, rewards, N, trials, scheme, generator)
            rms.append(float((g - exact).norm(dim=1).pow(2).mean().sqrt()))
            bias.append(float((g.mean(dim=0) - exact).norm()))
        out[scheme] = {"rms_error": rms, "bias": bias}
    return out


def identity_case(model, tokenizer, problem_row: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The one-step game on one problem: the warm start's next-token probabilities (V,) where its
    answer's number begins, and the reward of each token (V,): 1 for the first token of the right
    answer (labkit.models.scoring.target_response_ids), 0 for every other.  Also what the game is, in words."""
    from ..models import scoring

    prompt = scoring.build_prompt_ids(tokenizer, problem_row["statement"])
    target = scoring.target_response_ids(tokenizer, problem_row["target"])
    prefix = tokenizer.encode('{"final_stock": ', add_special_tokens=False)
    if target[:len(prefix)] != prefix:
        raise ValueError("the answer's tokens do not begin with the JSON key's tokens; the game is not defined")
    with torch.no_grad():
        logits = model(torch.tensor([prompt + prefix])).logits[0, -1].double()  # (V,)
    probs = torch.softmax(logits, dim=-1)
    rewards = torch.zeros_like(probs)
    rewards[target[len(prefix)]] = 1.0
    return probs, rewards, {"problem_id": problem_row["id"], "right_token": tokenizer.decode([target[len(prefix)]]),
                            "p_right": float(probs[target[len(prefix)]])}


# -- 2. The estimator's noise at the warm start, in weight space --------------------------------------


def _flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double()


def batch_gradients(model, tokenizer, chosen: list[dict], G: int, seeds: list[int], schemes) -> tuple[dict, torch.Tensor]:
    """One batch: G rollouts of each chosen problem from `model` (the fast sampler, verified), and for
    each scheme the gradient (flat, float64) of the first update's surrogate -mean_i A_i s_i, where s_i
    is response i's token-mean log-prob (the protocol's reduction; at the first update the ratio is 1,
    so this is the clipped surrogate's gradient).  Returns ({scheme: gradient}, rewards (P, G))."""
    from ..models import sampling, scoring

    prompts = [scoring.build_prompt_ids(tokenizer, p["statement"]) for p in chosen]
    groups = sampling.sample_groups(model, tokenizer, [(p["id"], q, p["problem"]) for p, q in zip(chosen, prompts)],
                                    G, seeds, sampler="fast")
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float64)  # (P, G)
    batch = scoring.make_batch([g.prompt_ids for g in groups for _ in range(G)],
                               [r.response_ids for g in groups for r in g.rollouts], tokenizer.pad_token_id)
    logp, _ = scoring.response_logprobs(model, batch)  # (P*G, R)
    s = losses.masked_mean(logp, batch.response_mask)  # (P*G,)
    out = {}
    for k, scheme in enumerate(schemes):
        A = scheme_advantages(rewards, scheme).reshape(-1).to(s.dtype)  # (P*G,)
        model.zero_grad(set_to_none=True)
        (-(A * s).mean()).backward(retain_graph=k < len(schemes) - 1)
        out[scheme] = _flat_grad(model)
    return out, rewards


def gradient_noise(model, tokenizer, pool: list[dict], *, P: int = NOISE_PROMPTS, G: int = NOISE_G,
                   batches: int = NOISE_BATCHES, reference_batches: int = REFERENCE_BATCHES,
                   seed: int = STUDY_SEED, progress: bool = False) -> dict:
    """Each scheme's gradient over `batches` independent batches against the reference (the mean of
    the leave-one-out gradient over `reference_batches` other batches): {"schemes": {scheme:
    {"variance" (E||g - mean g||^2), "mean_norm" (||mean g||), "snr" (||mean g||^2 / variance: the plug-in, biased
    upward by about 1/batches), "snr_corrected" with its jackknife "snr_interval" (`snr_with_interval`),
    "snr_minus_leave_one_out" (`snr_difference`, paired), "cosine" (mean cosine of g with the reference),
    "cosine_of_mean"}}, "reference_norm",
    "zero_signal" (share of groups whose rewards were all equal), "rollouts"}."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(pool), generator=generator).tolist()
    need = (batches + reference_batches) * P
    if need > len(pool):
        order = (order * math.ceil(need / len(pool)))[:need]  # prompts repeat across batches, never within one
    model.eval()  # the protocol scores in eval mode (dropout off)
    reference = None
    if batches % NOISE_CHUNKS:
        raise ValueError(f"batches {batches}: must split into {NOISE_CHUNKS} equal chunks (the jackknife's units)")
    chunk_size = batches // NOISE_CHUNKS
    sums = {s: {"sum": None, "sq": 0.0, "cos": 0.0, "chunk_sums": [], "chunk_sq": []} for s in ADVANTAGE_SCHEMES}
    constant, groups = 0, 0
    for b in range(reference_batches + batches):
        chosen = [pool[i] for i in order[b * P:(b + 1) * P]]
        seeds = [seed * 1000 + b * P * G + j for j in range(P * G)]
        measuring = b >= reference_batches
        grads, rewards = batch_gradients(model, tokenizer, chosen, G, seeds,
                                         ADVANTAGE_SCHEMES if measuring else ("leave_one_out",))
        if not measuring:
            g = grads["leave_one_out"]
            reference = g / reference_batches if reference is None else reference + g / reference_batches
            continue
        constant += int(losses.zero_variance_groups(rewards).sum())
        groups += P
        for scheme, g in grads.items():
            acc = sums[scheme]
            acc["sum"] = g.clone() if acc["sum"] is None else acc["sum"] + g
            acc["sq"] += float(g.pow(2).sum())
            if (b - reference_batches) % chunk_size == 0:  # a new chunk begins
                acc["chunk_sums"].append(torch.zeros_like(g, dtype=torch.float64))
                acc["chunk_sq"].append(0.0)
            acc["chunk_sums"][-1] += g.double()
            acc["chunk_sq"][-1] += float(g.double().pow(2).sum())
            norm = float(g.norm())
            acc["cos"] += float(g @ reference) / (norm * float(reference.norm())) if norm > 0 else 0.0
        if progress:
            print(f"\rgradient noise: batch {b + 1 - reference_batches}/{batches}", end="", flush=True)
    if progress:
        print()
    out = {}
    for scheme, acc in sums.items():
        mean = acc["sum"] / batches
        variance = acc["sq"] / batches - float(mean.pow(2).sum())
        out[scheme] = {"variance": variance, "mean_norm": float(mean.norm()),
                       "snr": float(mean.pow(2).sum()) / variance if variance > 0 else math.inf,
                       **snr_with_interval(torch.stack(acc["chunk_sums"]),
                                           torch.tensor(acc["chunk_sq"], dtype=torch.float64), chunk_size),
                       "cosine": acc["cos"] / batches,
                       "cosine_of_mean": float(mean @ reference) / (float(mean.norm()) * float(reference.norm()))}
    chunks = {scheme: (torch.stack(acc["chunk_sums"]), torch.tensor(acc["chunk_sq"], dtype=torch.float64))
              for scheme, acc in sums.items()}
    for scheme in out:  # each scheme against the unbiased baseline, paired on the same batches
        if scheme != "leave_one_out":
            out[scheme]["snr_minus_leave_one_out"] = snr_difference(chunks[scheme], chunks["leave_one_out"], chunk_size)
    return {"schemes": out, "reference_norm": float(reference.norm()), "zero_signal": constant / groups,
            "rollouts": (batches + reference_batches) * P * G, "P": P, "G": G, "batches": batches,
            "reference_batches": reference_batches}


def corrected_snr(total: torch.Tensor, squares: float, n: int) -> float:
    """The signal-to-noise ||E g||^2 / E||g - E g||^2 of n gradients, from their sum (D,) and their summed squared
    norms, with the plug-in's upward bias removed.

    With s^2 = (sum ||g_i||^2 - n ||mean||^2) / (n - 1), the unbiased total variance, E ||mean||^2 = ||E g||^2 +
    E s^2 / n: the plug-in ||mean||^2 / s^2 overstates the ratio by about 1/n, so the estimate is
    ||mean||^2 / s^2 - 1 / n (it can fall below 0 when the signal is below the noise of n gradients)."""
    mean_sq = float((total / n).pow(2).sum())
    s2 = (squares - n * mean_sq) / (n - 1)
    return mean_sq / s2 - 1.0 / n


def jackknife(estimate, K: int) -> tuple[float, float]:
    """(theta, se): `estimate(None)` on all K chunks, and the jackknife standard error of it from the K estimates
    that leave one chunk out, `estimate(k)`: se = sqrt((K - 1) / K * sum_k (theta_-k - mean theta_-k)^2)."""
    left_out = torch.tensor([estimate(k) for k in range(K)], dtype=torch.float64)
    return estimate(None), math.sqrt((K - 1) / K * float((left_out - left_out.mean()).pow(2).sum()))


def _kept_snr(chunk_sums: torch.Tensor, chunk_squares: torch.Tensor, chunk_size: int, drop: int | None) -> float:
    """`corrected_snr` of the gradients of every chunk but `drop` (None: all of them)."""
    keep = [k for k in range(chunk_sums.shape[0]) if k != drop]
    return corrected_snr(chunk_sums[keep].sum(0), float(chunk_squares[keep].sum()), len(keep) * chunk_size)


def snr_with_interval(chunk_sums: torch.Tensor, chunk_squares: torch.Tensor, chunk_size: int) -> dict:
    """`corrected_snr` of all the gradients and its `jackknife` 95% interval, each of the K chunks left out in turn.

    chunk_sums (K, D) float64: each chunk's sum of its `chunk_size` gradients; chunk_squares (K,): each chunk's summed
    squared norms.  The interval is theta +- 1.96 se (a normal approximation over K = NOISE_CHUNKS units).
    Returns {"snr_corrected", "snr_interval", "snr_se", "jackknife_chunks"}."""
    K = chunk_sums.shape[0]
    theta, se = jackknife(lambda drop: _kept_snr(chunk_sums, chunk_squares, chunk_size, drop), K)
    return {"snr_corrected": theta, "snr_interval": [theta - 1.96 * se, theta + 1.96 * se], "snr_se": se,
            "jackknife_chunks": K}


def snr_difference(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], chunk_size: int) -> dict:
    """Scheme a's `corrected_snr` minus scheme b's, on the same batches, with the `jackknife` 95% interval of the
    difference (the same chunks left out of both: a paired comparison, not two intervals side by side).
    a, b: (chunk sums (K, D), chunk squared norms (K,)).  Returns {"difference", "interval", "se"}."""
    theta, se = jackknife(lambda drop: _kept_snr(*a, chunk_size, drop) - _kept_snr(*b, chunk_size, drop),
                          a[0].shape[0])
    return {"difference": theta, "interval": [theta - 1.96 * se, theta + 1.96 * se], "se": se}


def run_study(preset: str = "tiny", out: str | Path | None = None, progress: bool = True) -> dict:
    """Both measurements on the warm start; written atomically to runs/<preset>/gradient_study/results.json
    (never over a finished one: move it aside first)."""
    from ..grpo import core, loop
    from ..models import presets
    from ..lab.runs import RunFolder, preset_folder, sha256_file, write_json

    torch.manual_seed(STUDY_SEED)
    folder = RunFolder(out if out is not None else preset_folder(preset, "gradient_study"))
    folder.open_for_writing()
    start = loop.warm_start_file(preset)
    model, tokenizer = presets.load(preset, state=start)
    pool = core.load_pool()
    began = time.perf_counter()
    cases = []
    for row in pool:  # the pool's first problem, and its first on which the warm start is unsure
        probs, rewards, about = identity_case(model, tokenizer, row)
        if not cases or UNSURE[0] <= about["p_right"] <= UNSURE[1]:
            cases.append({**about, **score_function_errors(probs, rewards)})
        if len(cases) == 2:
            break
    noise = gradient_noise(model, tokenizer, pool, progress=progress)
    results = {"format": "labkit gradient study v2", "start_file_sha256": sha256_file(start),
               "identity": {"trials": IDENTITY_TRIALS, "cases": cases}, "noise": noise,
               "seconds": time.perf_counter() - began}
    write_json(folder.path / "results.json", results)
    folder.mark_finished({"results_sha256": sha256_file(folder.path / "results.json")})
    return results
