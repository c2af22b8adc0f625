"""The GRPO loop: the protocol's 100 iterations with three policy roles kept apart.

    role       what it is                                            gradients
    reference  a copy reloaded exactly from the warm-start file      never (frozen, digest re-checked)
    old        the policy that sampled an iteration's rollouts;      never (log-probs recorded
               its log-probs are recorded at sampling time            at sampling, never replaced)
    current    the policy being optimised                            yes

One iteration, in the order of the code below (book/protocol.md, "GRPO"):

    1. take the next 4 prompts of a seeded permutation of the 872-problem pool
    2. sample G responses to each with the old policy (= current before its updates)
    3. score them with the verifier; group advantages A = (r - mean) / (std + 1e-8)
    4. check that full-sequence scoring reproduces the recorded log-probs (within 2e-4)
    5. two updates on the same rollouts: clipped surrogate + 0.02 x exact prefix KL,
       AdamW, grad-norm clip 1, warm-up then linear decay of the learning rate
    6. log, keep every raw rollout, and (when asked) save the full resumable state

Eval mode throughout (dropout off): it does not forbid autograd.  No critic.
Zero-variance groups are counted and contribute no surrogate gradient; no reward
is ever invented to break them.

Run folder (a `labkit.lab.runs.RunFolder`): `rollouts.jsonl.gz` (every rollout, one gzip member
appended per iteration), `timings.jsonl` (wall-clock evidence, one line per iteration, kept
outside the compared state), `parts.json` (the ledger: each part's rows, size and digest, each
state's digest), `history.json` (per-iteration metrics), `model.safetensors` (final policy,
reloaded and its digest checked), `states/iter-<k>.pt.gz` (full states, each carrying the ledger
of its boundary), `manifest.json` (with the final ledger), `FINISHED`.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint_curves, losses
from ..task import data, problems as task
from ..models import presets as models, rollouts, sampling, scoring, shared_prompt
from ..lab import state as state_lib
from ..config import SEED_OFFSETS, PresetConfig, get_preset
from ..lab.runs import (REPO_ROOT, ArtifactError, RunFolder, UnfinishedRunError, display_path, is_finished, preset_folder,
                   read_json, run_path, same_folder, write_json)
from ..train.schedule import clipped_step, warmup_linear_decay
from . import variants
from .variants import Resolved, Variant, resolve

PROTOCOL = Variant()  # the protocol's loop: every switch at its default
from ..lab.runtime import code_digests, data_digests, environment, seed_everything
from ..lab.runtime import deterministic as deterministic_algorithms

# The prompt order and the sampling seeds come from two generators of their own,
# seeded apart from each other and from the SFT branches.
PROMPT_ORDER_SEED_OFFSET = SEED_OFFSETS["grpo_prompt_order"]
GENERATION_SEED_OFFSET = SEED_OFFSETS["grpo_generation"]
REWARD_SEED_OFFSET = SEED_OFFSETS["random_reward"]  # the random-reward control's stream (labkit.grpo.variants)
SEED_RANGE = 2**62


# -- 1. The prompt pool and its order ----------------------------------------------------------


def load_pool() -> list[dict]:
    """The 872 pool problems (train minus the warm-start set), statements joined with labels.

    Read in the learning phase: test statements and labels are refused by `labkit.task.data`.
    """
    statements = data.open_records("statements", "train", "learning")
    labels = {r["id"]: r for r in data.open_records("labels", "train", "learning")}
    pool = set(task.pool_ids(statements))
    return [{**s, **labels[s["id"]]} for s in statements if s["id"] in pool]


class PromptOrder:
    """A seeded permutation of the pool, walked with a cursor and redrawn at each new epoch.

    State: {"epoch", "cursor", "permutation"}; the permutation of epoch e is a
    pure function of (seed, e), so a resumed run continues exactly.
    """

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.epoch, self.cursor = 0, 0
        self.permutation = self._draw(0)

    def _draw(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + 1_000_003 * epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def take(self, count: int) -> list[int]:
        """The next `count` pool indices, crossing into the next epoch when the pool runs out."""
        out = []
        while len(out) < count:
            if self.cursor == self.size:
                self.epoch, self.cursor = self.epoch + 1, 0
                self.permutation = self._draw(self.epoch)
            out.append(self.permutation[self.cursor])
            self.cursor += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "permutation": list(self.permutation)}

    def restore(self, saved: dict) -> None:
        self.epoch, self.cursor, self.permutation = saved["epoch"], saved["cursor"], list(saved["permutation"])


# -- 2. An iteration's groups: sample, verify, advantages -------------------------------------


def sample_groups(model, tokenizer, chosen: list[dict], prompts: dict[str, list[int]], seeds: list[int], G: int,
                  iteration: int, sampler: str, max_new_tokens: int, stem_tag: str = "") -> list[sampling.Group]:
    """G responses to each chosen problem, sampled by the current (= old) policy in one sampler call.

    chosen: the iteration's P pool problems; seeds: P x G, prompt-major.  Each group is
    verified against its problem by `labkit.task.verifier` (the model never sees the labels).
    stem_tag: appended to each group's id stem (dynamic sampling's extra draws: "-d1", ...).
    """
    return sampling.sample_groups(
        model, tokenizer, [(p["id"], prompts[p["id"]], p["problem"]) for p in chosen], G, seeds, sampler=sampler,
        max_new_tokens=max_new_tokens, policy_digest=models.parameter_digest(model),
        rollout_ids=[f"{stem}{stem_tag}-{j}" for stem in group_stems(chosen, G, iteration) for j in range(G)],
    )


def group_stems(chosen: list[dict], G: int, iteration: int) -> list[str]:
    """One id stem per group, "g<G>-it<iteration>-<problem id>"; a problem drawn again in the same
    iteration (the prompt order wrapped into a new permutation) gets "-r<k>" for its k-th repeat,
    so that every rollout id stays unique."""
    seen: dict[str, int] = {}
    stems = []
    for p in chosen:
        k = seen.get(p["id"], 0)
        seen[p["id"]] = k + 1
        stems.append(f"g{G}-it{iteration:03d}-{p['id']}" + (f"-r{k}" if k else ""))
    return stems


def iteration_metrics(rows: list[dict], valid: list[bool], group_size: int) -> dict:
    """The per-iteration figures of the log, from the iteration's rollout rows (prompt-major groups).

    A group is `group_size` consecutive rows, identified by its position in the iteration, never
    by its problem id: when the prompt order wraps into a new permutation inside one iteration,
    the same problem can be drawn twice, and its two groups stay two groups.

    reward                      mean reward over the P x G rollouts
    reward_std                  mean over groups of the group's reward std (population, ddof 0)
    frac_reward_zero_std        share of groups whose rewards are all equal (no signal)
    valid_json                  share of responses that are schema-valid answers (`valid`)
    completions/mean_length     mean response length in tokens, EOS included
    completions/clipped_ratio   share of responses cut at the token limit (finish_reason "length")
    """
    if group_size < 1 or len(rows) % group_size:
        raise ValueError(f"{len(rows)} rollout rows do not split into groups of {group_size}")
    rewards = torch.tensor([float(r["reward"]) for r in rows]).reshape(-1, group_size)  # (P, G)
    return {
        "reward": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0, dim=1).mean()),
        "frac_reward_zero_std": float(losses.zero_variance_groups(rewards).float().mean()),
        "valid_json": sum(valid) / len(valid),
        "completions/mean_length": sum(len(r["response_ids"]) for r in rows) / len(rows),
        "completions/clipped_ratio": sum(r["finish_reason"] == "length" for r in rows) / len(rows),
    }


# -- 3. One update on the iteration's rollouts -------------------------------------------------


def padded(rows: list[list[float]], width: int) -> torch.Tensor:
    """(B, width) float32 tensor of `rows`, zero-padded on the right."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def plain_scorer(batch: scoring.Batch):
    """score(model) -> (logp (B, R), logits (B, R, V)): one forward over each full row (the protocol's)."""
    return lambda model: scoring.response_logprobs(model, batch, return_logits=True)


def shared_prompt_scorer(prompts: list[list[int]], responses: list[list[int]], G: int, pad_id: int):
    """score(model) -> the same (B, R), (B, R, V) as `plain_scorer`, each of the P prompts computed once
    for its G responses (`labkit.models.shared_prompt`; equal within float32 rounding).  prompts: P x G rows."""
    return lambda model: shared_prompt.shared_response_logprobs(model, prompts[::G], responses, G, pad_id,
                                                                return_logits=True)


def reference_scores(reference, batch: scoring.Batch, score=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp_ref (B, R), logits_ref (B, R, V)) of the frozen reference: one forward per iteration,
    shared by its updates (the reference and the batch do not change between them).
    score: a scorer (`plain_scorer`, the default, or `shared_prompt_scorer`)."""
    with torch.no_grad():
        return (score or plain_scorer(batch))(reference)


def objective_loss(logp_cur: torch.Tensor, logits_cur: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor],
                   mask: torch.Tensor, old_logprobs: torch.Tensor | None, advantages: torch.Tensor | None,
                   group_size: int, config: PresetConfig, resolved: Resolved,
                   reduction: str = "sequence", measure_mask: torch.Tensor | None = None,
                   token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Loss = the objective's term + kl_coef x its KL term (both from `resolved`, a looked-up variant).

    The protocol's term is the clipped surrogate on group advantages, reduced token -> response ->
    prompt; RFT's and SFT's is the rows' mean negative log-likelihood, all rows one group.  The
    logged `kl`, `kl_k3` and `entropy` are always the protocol's measures, a sequence mean over
    `measure_mask` (default: `mask`; the loop passes every response token, so that a filter on the
    loss does not change what is measured), whatever the loss's reduction (`labkit.grpo.variants`).
    token_weights: (B, R) truncated importance sampling's weights on the term, or None.
    Shapes as `grpo_loss`'s.  Returns (loss, metrics).
    """
    groups = group_size if resolved.objective.grouped else None
    term, term_stats = resolved.objective.term(logp_cur, old_logprobs, advantages, mask, groups, reduction,
                                               resolved.clip(config), token_weights)
    reduce = lambda values: losses.reduce(values, mask, groups, reduction, config.max_response_tokens)  # noqa: E731
    measured = mask if measure_mask is None else measure_mask
    measure = (reduce if reduction == "sequence" and measured is mask
               else lambda values: losses.reduce(values, measured, groups, "sequence"))  # noqa: E731
    penalty, exact, k3 = resolved.kl_term((logp_cur, logits_cur), reference, reduce, measure, config.kl_block_size)
    loss = term + config.kl_coef * penalty
    with torch.no_grad():
        entropy = measure(losses.token_entropy(logits_cur.detach()))
    metrics = {"loss": float(loss.detach()), "surrogate": float(term.detach()), "kl": float(exact.detach()),
               "kl_k3": float(k3.detach()), "entropy": float(entropy), **term_stats}
    return loss, metrics


def grpo_loss(logp_cur: torch.Tensor, logits_cur: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor],
              mask: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, group_size: int,
              config: PresetConfig, variant: Variant = PROTOCOL) -> tuple[torch.Tensor, dict]:
    """Loss = clipped surrogate + kl_coef x KL, reduced token -> response -> prompt (the protocol's
    variant: the exact prefix KL, the sequence reduction; `labkit.grpo.variants` for the others).

    logp_cur, logits_cur: (B, R), (B, R, V) of the current policy (with gradients), B = P x G
                          rows, prompt-major, R the longest response; reference: `reference_scores`
                          of the same batch
    mask:                 (B, R) response mask; old_logprobs (B, R) recorded at sampling time;
                          advantages (B,) one per response (both detached)
    Returns (loss, metrics) with the surrogate, the KL and their statistics.
    """
    return objective_loss(logp_cur, logits_cur, reference, mask, old_logprobs, advantages, group_size, config,
                          resolve(variant), variant.reduction)


def grpo_update(model, optimizer, batch: scoring.Batch, old_logprobs: torch.Tensor | None,
                advantages: torch.Tensor | None, reference: tuple[torch.Tensor, torch.Tensor], lr: float, *,
                group_size: int, config: PresetConfig, before_step=None, variant: Variant = PROTOCOL,
                score=None, resolved: Resolved | None = None, loss_mask: torch.Tensor | None = None,
                token_weights: torch.Tensor | None = None) -> dict:
    """One AdamW update of the variant's loss (`objective_loss`) at learning rate `lr`, gradient norm
    clipped (`schedule.clipped_step`); returns its metrics.

    One forward of the current policy (`score`: a scorer of the batch, default `plain_scorer`).
    `before_step(logp_cur)` (detached, (B, R)) runs after it and before anything changes the
    weights: the loop passes the pre-update check there, so the check costs no forward of its own.
    resolved: `variant` looked up in `labkit.grpo.variants`' tables (the loop passes the one it holds;
    default: looked up here).
    loss_mask: (B, R) the tokens the loss sees, when not all the response tokens (overlong filtering).
    token_weights: (B, R) truncated importance sampling's weights (`losses.truncated_importance_weights`).
    """
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    logp_cur, logits_cur = (score or plain_scorer(batch))(model)  # (B, R), (B, R, V)
    if before_step is not None:
        before_step(logp_cur.detach())
    mask = (batch.response_mask if loss_mask is None else loss_mask).to(device)
    to_device = lambda t: None if t is None else t.to(device)  # noqa: E731  (RFT and SFT have neither)
    loss, metrics = objective_loss(logp_cur, logits_cur, reference, mask, to_device(old_logprobs),
                                   to_device(advantages), group_size, config, resolved or resolve(variant),
                                   variant.reduction,
                                   measure_mask=None if loss_mask is None else batch.response_mask.to(device),
                                   token_weights=to_device(token_weights))
    grad_norm = clipped_step(optimizer, loss, lr, config.grad_clip)
    return {**metrics, "grad_norm": grad_norm, "learning_rate": lr}


# -- 4. The loop's state and its start ----------------------------------------------------------


def default_run_dir(preset: str, group_size: int) -> Path:
    """runs/<preset>/grpo for the preset's own group size, runs/<preset>/grpo_g<G> for another."""
    name = "grpo" if group_size == get_preset(preset).group_size else f"grpo_g{group_size}"
    return preset_folder(preset, name)


def state_path(run_dir: Path, iteration: int) -> Path:
    return Path(run_dir) / "states" / f"iter-{iteration:03d}.pt.gz"


def warm_start_file(preset: str) -> Path:
    warm = preset_folder(preset, "warm_start")
    if not is_finished(warm):
        raise FileNotFoundError(f"GRPO starts from the warm start, but {warm} is not a finished run; "
                                f"run `python -m labkit warm-start --preset {preset}` first")
    RunFolder(warm).manifest()  # refuses a manifest that is missing, edited or damaged
    return warm / "model.safetensors"


def rollout_record(r: rollouts.Rollout, iteration: int, verdict, advantage: float) -> dict:
    """One row of rollouts.jsonl.gz: everything needed to reload and re-check a rollout."""
    return {
        "rollout_id": r.rollout_id,
        "iteration": iteration,
        "problem_id": r.problem_id,
        "seed": r.seed,
        "prompt_length": len(r.prompt_ids),
        "response_ids": list(r.response_ids),
        "text": r.text,
        "finish_reason": r.finish_reason,
        "tokenization_valid": r.tokenization_valid,
        "old_logprobs": list(r.old_logprobs),
        "reward": float(verdict.reward),
        "reason": verdict.reason,
        "advantage": advantage,
        "policy_digest": r.policy_digest,
        "sampler": r.sampler,
    }


@dataclass
class Loop:
    """What a GRPO run carries from one iteration to the next (all of it is in a saved state)."""

    config: PresetConfig
    G: int
    model: torch.nn.Module
    reference: torch.nn.Module
    tokenizer: object
    optimizer: torch.optim.Optimizer
    pool: list[dict]
    prompts: dict[str, list[int]]
    order: PromptOrder
    generation: torch.Generator
    identity: dict
    total_updates: int
    reference_digest: str
    variant: Variant = PROTOCOL
    updates_per_iteration: int = 2
    shared_prompts: bool = False  # score each prompt once per group in the updates (labkit.models.shared_prompt)
    reward_generator: torch.Generator | None = None  # the random-reward control's own stream
    learned_verifier: object | None = None  # the proxy of reward "learned" (labkit.studies.reward_model), passed in
    history: list[dict] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    next_update: int = 0
    resolved: Resolved | None = None  # the variant looked up in labkit.grpo.variants' tables, once (new_loop's)

    def __post_init__(self):
        self.resolved = self.resolved or resolve(self.variant)

    @property
    def generators(self) -> dict[str, torch.Generator]:
        out = {"generation": self.generation}
        if self.reward_generator is not None:
            out["reward"] = self.reward_generator
        return out

    def capture(self, iteration: int) -> dict:
        return state_lib.capture_state(
            model=self.model, optimizer=self.optimizer,
            scheduler={"next_update": self.next_update, "total": self.total_updates},
            data_order=self.order.state(), generators=self.generators, history=self.history,
            consumed_ids=self.consumed, identity=self.identity, progress={"iteration": iteration},
        )

    def restore(self, path: Path) -> tuple[int, dict]:
        """Continue from a saved state of the same run; returns (its iteration, its evidence)."""
        saved, evidence = state_lib.load_state(path)
        if saved["identity"] != self.identity:
            diff = sorted(k for k in self.identity if saved["identity"].get(k) != self.identity[k])
            raise ValueError(f"{path} belongs to another run: identity fields {diff} differ")
        plain = state_lib.restore_state(saved, model=self.model, optimizer=self.optimizer, generators=self.generators)
        self.order.restore(plain["data_order"])
        self.history, self.consumed = plain["history"], plain["consumed_ids"]
        self.next_update = plain["scheduler"]["next_update"]
        return plain["progress"]["iteration"], evidence


def load_roles(config: PresetConfig, start_file: Path, device: str) -> tuple[torch.nn.Module, torch.nn.Module,
                                                                              object, str]:
    """The policy and the frozen reference, two loads of one file (eval mode, digests compared);
    returns (policy, reference, tokenizer, their digest)."""
    model, tokenizer = models.load(config.name, state=start_file, device=device)
    reference, _ = models.load(config.name, state=start_file, device=device)
    reference.requires_grad_(False)
    model.eval()
    reference.eval()
    start_digest, reference_digest = models.parameter_digest(model), models.parameter_digest(reference)
    if start_digest != reference_digest:
        raise RuntimeError(f"policy {start_digest} and reference {reference_digest} differ after loading one file")
    return model, reference, tokenizer, start_digest


def new_loop(config: PresetConfig, G: int, total_iterations: int, model, reference, tokenizer, start_digest: str, *,
             start_label: str, sampler: str, device: str, variant: Variant = PROTOCOL, shared_prompts: bool = False,
             learned_verifier=None, extra_identity: dict | None = None) -> Loop:
    """Stage 0 after the two loads: AdamW, the pool and its prompts, the seeded streams, the identity.

    learned_verifier: the proxy a variant with reward "learned" optimises (a
    `labkit.studies.reward_model.LearnedVerifier`, loaded and checked by the caller); None for any other."""
    resolved = resolve(variant)
    if resolved.reward.needs_learned_verifier != (learned_verifier is not None):
        raise ValueError(f"variant reward {variant.reward!r} " + (
            "needs the learned verifier: pass learned_verifier=reward_model.load_verifier(preset)"
            if learned_verifier is None else "takes no learned verifier (only reward 'learned' does)"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.grpo_lr,
                                  weight_decay=config.grpo_weight_decay)
    pool = load_pool()
    identity = {
        "preset": config.name, "config_fingerprint": config.fingerprint(), "group_size": G,
        "iterations": total_iterations, "sampler": sampler, "device": device,
        "torch_threads": torch.get_num_threads(), "start_file": start_label,
        "start_digest": start_digest, "pool_ids": [r["id"] for r in pool],
        **resolved.identity,  # a variant's switches make another run; the protocol's identity stays as it was
        **({"scoring": "shared_prompt"} if shared_prompts else {}),  # the plain path stays unnamed
        **({"reward_model_sha256": learned_verifier.file_sha256} if learned_verifier is not None else {}),
        **(extra_identity or {}),
    }
    updates = variant.updates_per_iteration or config.updates_per_iteration
    return Loop(config=config, G=G, model=model, reference=reference, tokenizer=tokenizer, optimizer=optimizer,
                pool=pool, prompts={r["id"]: scoring.build_prompt_ids(tokenizer, r["statement"], config.max_prompt_tokens)
                                    for r in pool},
                order=PromptOrder(len(pool), config.seed + PROMPT_ORDER_SEED_OFFSET),
                generation=torch.Generator().manual_seed(config.seed + GENERATION_SEED_OFFSET), identity=identity,
                total_updates=total_iterations * updates, reference_digest=start_digest, variant=variant,
                updates_per_iteration=updates, shared_prompts=shared_prompts,
                reward_generator=(torch.Generator().manual_seed(config.seed + REWARD_SEED_OFFSET)
                                  if resolved.reward.needs_generator else None),
                learned_verifier=learned_verifier, resolved=resolved)


def start_loop(config: PresetConfig, G: int, total_iterations: int, start_file: Path, sampler: str,
               device: str, variant: Variant = PROTOCOL, shared_prompts: bool = False,
               learned_verifier=None) -> Loop:
    """Stage 0: the three roles (policy and reference are two loads of one file), AdamW, the pool."""
    seed_everything(config.seed)
    model, reference, tokenizer, start_digest = load_roles(config, start_file, device)
    label = str(start_file.relative_to(REPO_ROOT)) if start_file.is_relative_to(REPO_ROOT) else str(start_file)
    return new_loop(config, G, total_iterations, model, reference, tokenizer, start_digest, start_label=label,
                    sampler=sampler, device=device, variant=variant, shared_prompts=shared_prompts,
                    learned_verifier=learned_verifier)


# -- 5. One iteration: sampling (stages 1-3), updating (4-5), the record (6) --------------------


@dataclass
class Sampled:
    """An iteration's draw: its prompts, their verified groups and what the updates optimise."""

    chosen: list[dict]
    """the P pool problems (labels included)"""
    groups: list[sampling.Group]
    """P groups of G rollouts, prompt-major, each verified"""
    optimised: torch.Tensor
    """(P, G) float32: the rewards the loop optimises (the verifier's, or the variant's)"""
    advantages: torch.Tensor
    """(P x G,) float64: the group advantages of `optimised`"""
    seconds: float
    """the sampling call's wall time"""
    dynamic: dict | None = None
    """dynamic sampling's account of the iteration (None without it): groups dropped, prompts drawn"""

    @property
    def rollouts(self) -> list[rollouts.Rollout]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def verdicts(self) -> list:
        return [v for g in self.groups for v in g.verdicts]


def optimised_rewards(groups: list[sampling.Group], loop: Loop) -> torch.Tensor:
    """(P, G) float32: the rewards the loop optimises (the variant's entry of `variants.REWARD_TABLE`),
    minus the variant's length penalty (none for the protocol)."""
    return loop.resolved.optimised_reward(groups, loop)


def advantages_of(loop: Loop, optimised: torch.Tensor) -> torch.Tensor:
    """(P x G,) prompt-major: the group advantages of the optimised rewards (P, G), as the loop's
    variant scales them."""
    return loop.resolved.advantages(optimised, loop.config.advantage_eps, loop.variant.scale_by_std).reshape(-1)


def sample_iteration(loop: Loop, iteration: int, sampler: str, chosen: list[dict] | None = None,
                     seeds: list[int] | None = None) -> Sampled:
    """Stages 1-3: the next P prompts, G responses each by the old policy (= the current one now),
    verified; the optimised rewards and their group advantages.

    chosen, seeds: the prompts and the P x G sampling seeds, when already drawn (`draw_prompts`)."""
    config, G = loop.config, loop.G
    if chosen is None:
        chosen, seeds = draw_prompts(loop)
    t0 = time.perf_counter()
    policy = loop.resolved.sampling_policy(loop.model)  # the policy itself, or a rounded copy of it
    groups = sample_groups(policy, loop.tokenizer, chosen, loop.prompts, seeds, G, iteration, sampler,
                           config.max_response_tokens)
    optimised = optimised_rewards(groups, loop)  # (P, G)
    # the variant's groups: these (the protocol), or with silent groups replaced (dynamic sampling)
    chosen, groups, optimised, dynamic = loop.resolved.refill(
        chosen, groups, optimised, loop.config.prompts_per_iteration,
        lambda tag: draw_and_sample(loop, policy, iteration, sampler, tag))
    seconds = time.perf_counter() - t0
    sampled = Sampled(chosen=chosen, groups=groups, optimised=optimised, advantages=advantages_of(loop, optimised),
                      seconds=seconds, dynamic=dynamic)
    repeated = set(loop.consumed).intersection(r.rollout_id for r in sampled.rollouts)
    if repeated:
        raise RuntimeError(f"rollouts {sorted(repeated)} were already optimised; a rollout is used once")
    return sampled


def draw_and_sample(loop: Loop, policy, iteration: int, sampler: str,
                    stem_tag: str) -> tuple[list[dict], list, torch.Tensor]:
    """P fresh prompts (the pool's next ones), G responses each by `policy` (the iteration's sampler),
    verified, and their optimised rewards (P, G): the extra draws of dynamic sampling
    (`variants.refill_silent_groups`)."""
    chosen, seeds = draw_prompts(loop)
    groups = sample_groups(policy, loop.tokenizer, chosen, loop.prompts, seeds, loop.G, iteration, sampler,
                           loop.config.max_response_tokens, stem_tag=stem_tag)
    return chosen, groups, optimised_rewards(groups, loop)


def draw_prompts(loop: Loop) -> tuple[list[dict], list[int]]:
    """Stage 1: the next P problems of the pool's permutation and the P x G sampling seeds."""
    P, G = loop.config.prompts_per_iteration, loop.G
    chosen = [loop.pool[i] for i in loop.order.take(P)]
    seeds = torch.randint(0, SEED_RANGE, (P * G,), generator=loop.generation).tolist()
    return chosen, seeds


# The rows each objective learns from (`variants.OBJECTIVE_TABLE`'s `rows`): (prompts, responses).
def rollout_rows(loop: Loop, s: Sampled) -> tuple[list[list[int]], list[list[int]]]:
    """GRPO: the iteration's own rollouts, with their advantages."""
    return [r.prompt_ids for r in s.rollouts], [r.response_ids for r in s.rollouts]


def own_correct_rows(loop: Loop, s: Sampled) -> tuple[list[list[int]], list[list[int]]]:
    """RFT: the iteration's responses whose optimised reward is 1 (possibly none)."""
    rollouts = s.rollouts
    keep = [i for i, value in enumerate(s.optimised.reshape(-1).tolist()) if value >= 1.0]
    return [rollouts[i].prompt_ids for i in keep], [rollouts[i].response_ids for i in keep]


def solver_target_rows(loop: Loop, s: Sampled) -> tuple[list[list[int]], list[list[int]]]:
    """SFT: the solver's target for each chosen prompt."""
    return ([loop.prompts[p["id"]] for p in s.chosen],
            [scoring.target_response_ids(loop.tokenizer, p["target"]) for p in s.chosen])


LEARNING_ROWS = {"rollouts": rollout_rows, "own_correct": own_correct_rows, "solver_targets": solver_target_rows}


def update_iteration(loop: Loop, s: Sampled) -> tuple[list[dict], dict]:
    """Stages 4-5: one batch, one reference forward, the updates (two in the protocol); the
    pre-update check rides on the first update's own forward, before its step, when the rows
    are the rollouts themselves (else it takes a forward of its own).  With logp_old from the
    trainer (`labkit.grpo.variants`), one forward before the updates recomputes logp_old, the check
    compares it with the sampler's record, and truncated importance sampling, when on, weighs
    each token by min(pi_trainer / pi_sampler, C).  Returns (the updates' metrics, the check's
    figures); marks the rollouts as used."""
    config, G, resolved = loop.config, loop.G, loop.resolved
    rollouts = s.rollouts
    check = {}

    def pre_update_check(logp_cur: torch.Tensor) -> None:
        t = time.perf_counter()
        check.update(sampling.compare_with_recorded(logp_cur, rollouts, tol=config.logprob_check_tol,
                                                    strict=resolved.strict_logprob_check))
        check["seconds"] = time.perf_counter() - t  # the comparison only: the forward is the update's

    on_rollouts = resolved.objective.rows == "rollouts"
    prompts, responses = LEARNING_ROWS[resolved.objective.rows](loop, s)
    kept = resolved.loss_rows(rollouts) if on_rollouts else None  # (B,) bool, or None: every row
    if kept is not None and not kept.any():
        prompts = []  # every response was filtered out: nothing to learn from
    if not on_rollouts or not prompts:
        pre_update_check(scoring.response_logprobs(loop.model, scoring.make_batch(
            [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts], pad_id=0))[0])
    updates = []
    if prompts:
        batch = scoring.make_batch(prompts, responses, pad_id=loop.tokenizer.pad_token_id)
        loss_mask = None if kept is None else batch.response_mask * kept[:, None].to(batch.response_mask.dtype)
        old = padded([r.old_logprobs for r in rollouts], batch.response_mask.shape[1]) if on_rollouts else None
        score = (shared_prompt_scorer(prompts, responses, G, loop.tokenizer.pad_token_id)
                 if loop.shared_prompts and on_rollouts else plain_scorer(batch))
        reference = reference_scores(loop.reference, batch, score)
        weights = None  # (B, R) truncated importance sampling's, or None
        if resolved.recompute_logp_old:  # the trainer's logp_old replaces the sampler's record
            with torch.no_grad():
                trainer_old = score(loop.model)[0]
            pre_update_check(trainer_old)
            if resolved.tis_cap is not None:
                weights = losses.truncated_importance_weights(trainer_old, old, batch.response_mask, resolved.tis_cap)
                active = batch.response_mask.bool()
                check.update({"tis_weight_mean": float(weights[active].mean()),
                              "tis_capped": float((weights[active] >= resolved.tis_cap).double().mean())})
            old = trainer_old
        for k in range(loop.updates_per_iteration):
            lr = warmup_linear_decay(loop.next_update, loop.total_updates, config.grpo_lr, config.warmup_fraction,
                                     config.final_lr_fraction)
            first = k == 0 and on_rollouts and not resolved.recompute_logp_old
            updates.append(grpo_update(loop.model, loop.optimizer, batch, old, s.advantages, reference, lr,
                                       group_size=G, config=config, before_step=pre_update_check if first else None,
                                       variant=loop.variant, score=score, resolved=resolved,
                                       loss_mask=loss_mask, token_weights=weights))
            loop.next_update += 1
    else:  # RFT with no correct response (or every response overlong): nothing to learn from, no update
        loop.next_update += loop.updates_per_iteration
    loop.consumed += [r.rollout_id for r in rollouts]
    return updates, check


def record_iteration(loop: Loop, iteration: int, s: Sampled, updates: list[dict], check: dict) -> tuple[dict, list[dict]]:
    """Stage 6: the iteration's log record (appended to the loop's history) and its rollout rows."""
    verdicts = s.verdicts
    flat_optimised = s.optimised.reshape(-1)
    rows = [{**rollout_record(r, iteration + 1, verdicts[i], float(s.advantages[i])),
             "optimised_reward": float(flat_optimised[i])} for i, r in enumerate(s.rollouts)]
    record = {
        "iteration": iteration + 1,
        "problem_ids": [p["id"] for p in s.chosen],
        **iteration_metrics(rows, [v.valid for v in verdicts], loop.G),
        "optimised_reward": float(s.optimised.mean()),
        "optimised/frac_reward_zero_std": float(losses.zero_variance_groups(s.optimised).float().mean()),
        "logprob_check/max_abs_diff": check["max_abs_diff"],
        # a sampler that differs from the trainer on purpose: the size of the mismatch, and the weights
        **({"sampler_mismatch": {k: check[k] for k in ("mean_abs_diff", "max_abs_diff", "tis_weight_mean", "tis_capped")
                                 if k in check}}
           if not loop.resolved.strict_logprob_check else {}),
        # DAPO's switches account for what they did (absent from the protocol's records)
        **({"dynamic_sampling": s.dynamic} if s.dynamic is not None else {}),
        **({"overlong_filtered": sum(r.finish_reason == "length" for r in s.rollouts)}
           if loop.resolved.loss_rows is not variants.all_rows else {}),
        "updates": updates,
        # the figures trainers log, from the last update of the iteration (None: no update ran)
        **{k: updates[-1][k] if updates else None
           for k in ("kl", "entropy", "grad_norm", "learning_rate", "clip_ratio/low_mean", "clip_ratio/high_mean",
                     "clip_ratio/region_mean")},
    }
    loop.history.append(record)
    return record, rows


def run_iteration(loop: Loop, iteration: int, sampler: str) -> tuple[dict, list[dict], dict]:
    """One iteration (stages 1-6 of the module docstring); returns (its log record, rows, timings)."""
    t_iteration = time.perf_counter()
    sampled = sample_iteration(loop, iteration, sampler)
    t0 = time.perf_counter()
    updates, check = update_iteration(loop, sampled)
    t_optimisation = time.perf_counter() - t0
    record, rows = record_iteration(loop, iteration, sampled, updates, check)
    timings = {"iteration": iteration + 1, "generation": sampled.seconds, "logprob_check": check["seconds"],
               "optimisation": t_optimisation - check["seconds"], "iteration_total": time.perf_counter() - t_iteration}
    return record, rows, timings


# -- 6. The run: options, folder, iterations, finish ---------------------------------------------


def _check_options(config: PresetConfig, G: int, total_iterations: int, stop_after, save_states_at) -> int:
    """Refuse bad option values before any work; returns the last iteration this call runs."""
    for name, value in (("group_size", G), ("iterations", total_iterations), ("stop_after", stop_after)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} {value!r}: must be an integer")
    if G < 2:
        raise ValueError(f"group_size {G}: a group needs at least 2 responses (its advantages compare them)")
    if total_iterations < 1:
        raise ValueError(f"iterations {total_iterations}: must be at least 1")
    if stop_after is not None and not 1 <= stop_after <= total_iterations:
        raise ValueError(f"stop_after {stop_after}: must lie in 1..{total_iterations} (the run's iterations)")
    bad_states = [k for k in save_states_at if not 1 <= k <= total_iterations]
    if bad_states:
        raise ValueError(f"save_states_at {bad_states}: each must lie in 1..{total_iterations}")
    return total_iterations if stop_after is None else stop_after


# A long run saves a resumable state on its own, every AUTOSAVE_ITERATIONS iterations or
# AUTOSAVE_SECONDS of wall time, whichever comes first, so that a crash or a Ctrl-C loses at
# most that much.  Only the newest such state is kept, and none once the run has finished
# (states asked for with save_states_at, and the last one, are always kept).
AUTOSAVE_ITERATIONS = 10
AUTOSAVE_SECONDS = 300.0


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; the message says which state to resume from, and how."""


def newest_state(folder: RunFolder) -> Path | None:
    """The run folder's state of the latest iteration that its ledger lists, or None."""
    listed = [name for name in folder.ledger()["files"] if name.startswith("states/iter-")]
    paths = [folder / name for name in listed if (folder / name).is_file()]
    return max(paths, key=lambda p: int(p.name[5:8])) if paths else None


def _earlier_attempt(folder: RunFolder) -> str | None:
    """A description of what an unfinished attempt left in the folder, or None if it holds none."""
    ledger = folder.ledger()
    rows = ledger["parts"].get(ROLLOUTS_PART, {}).get("rows", 0)
    states = sorted(p.name for p in folder.states.glob("iter-*.pt.gz"))
    if not rows and not states and not ledger["files"]:
        return None
    newest = newest_state(folder)
    return (f"{rows} rollouts" + (f", newest state {newest.relative_to(folder.path)}" if newest else ", no state"))


def _prepare_folder(folder: RunFolder, loop: Loop, resume_from: Path | None, restart: bool,
                    stop_after: int | None) -> tuple[int, int]:
    """Restore a state (if any) and clear or cut back the folder; returns (first iteration to run,
    the first iteration whose rollouts this folder holds).

    The folder and the state are compared as real paths (links and `..` resolved), so a resume
    in the run's own folder is seen as one however either is spelled, and the state resumed
    from is never deleted.  A fresh start into a folder an unfinished attempt left is refused
    unless `restart` says to delete that attempt."""
    in_own_folder = resume_from is not None and same_folder(resume_from.parent.parent, folder.path)
    if resume_from is None and not restart:
        attempt = _earlier_attempt(folder)
        if attempt:
            raise UnfinishedRunError(
                f"{display_path(folder.path)} holds an unfinished attempt ({attempt}): pass --resume to continue "
                "from its newest state, or --restart to delete it and start afresh")
    first_iteration, evidence = loop.restore(resume_from) if resume_from is not None else (0, {})
    if stop_after is not None and first_iteration >= stop_after:  # checked before anything in the folder is cut
        raise ValueError(f"stop_after {stop_after}: {display_path(resume_from)} is already after iteration "
                         f"{first_iteration}; stop after a later iteration")
    if in_own_folder:
        # Resuming in the run's own folder: cut the parts back to the state's boundary.
        if "ledger" not in evidence:
            raise ArtifactError(f"{resume_from} carries no ledger of its folder's parts (written by an older "
                                "labkit); start the run afresh")
        removed, first_in_folder = drop_after(folder, first_iteration, evidence["ledger"]), 1
    else:
        # A fresh start, or a resume into a new folder (which then holds iterations k+1.. only).
        removed = [str(p.relative_to(folder.path)) for p in folder.clear(ATTEMPT_FILES)]
        first_in_folder = first_iteration + 1
    if removed:
        print(f"{folder}: removed or cut {len(removed)} file(s) of an earlier, unfinished attempt "
              f"({', '.join(sorted(removed))})", flush=True)
    return first_iteration, first_in_folder


def run_grpo(
    config: PresetConfig | str,
    run_dir: str | Path | None = None,
    *,
    group_size: int | None = None,
    iterations: int | None = None,
    stop_after: int | None = None,
    save_states_at: tuple[int, ...] = (),
    resume_from: str | Path | None = None,
    resume: bool = False,
    restart: bool = False,
    sampler: str = "reference",
    start_file: str | Path | None = None,
    device: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    variant: Variant = PROTOCOL,
    shared_prompts: bool = False,
    learned_verifier=None,
) -> dict:
    """Run GRPO into `run_dir`; returns the manifest (or, when stopped early, a summary).

    group_size      G (default: the preset's 4); iterations: default the preset's 100
    stop_after      stop after this many iterations (saving the state); the run is then not finished
    save_states_at  iterations after which to save a full state (the last is always saved; a
                    state is also saved every AUTOSAVE_ITERATIONS or AUTOSAVE_SECONDS, kept until
                    the run finishes)
    resume_from     a state file of the same run to continue from, with fresh objects
    resume          continue from the newest state in `run_dir` (an unfinished attempt's)
    restart         delete an unfinished attempt in `run_dir` and start afresh (without resume,
                    restart or overwrite, a folder holding an attempt is refused)
    sampler         "reference" (the protocol's, no KV cache) or "fast" (recorded in the manifest)
    start_file      the warm-start safetensors (default: runs/<preset>/warm_start/model.safetensors)
    variant         the loop's switches (`labkit.grpo.variants`; default: the protocol's)
    learned_verifier  the proxy a variant with reward "learned" optimises
                    (`labkit.studies.reward_model.load_verifier`); None for every other variant
    shared_prompts  score each prompt once per group in the reference forward and the updates
                    (`labkit.models.shared_prompt`: equal within float32 rounding, about 3.5x faster at G=8);
                    the protocol's run keeps the plain path, as it keeps the reference sampler

    One process writes a run folder at a time (`runs.hold_folder`).  Ctrl-C finishes the current
    iteration, saves its state and raises `Interrupted` saying how to resume (a second Ctrl-C
    stops at once; the newest saved state is then the one to resume from).
    """
    config = get_preset(config) if isinstance(config, str) else config
    G = config.group_size if group_size is None else group_size
    total_iterations = config.grpo_iterations if iterations is None else iterations
    end_iteration = _check_options(config, G, total_iterations, stop_after, save_states_at)
    if resume and resume_from is not None:
        raise ValueError("resume and resume_from: give one (--resume takes the folder's newest state)")
    folder = RunFolder(run_dir or default_run_dir(config.name, G)).open_for_writing(overwrite)
    try:
        if resume:
            resume_from = newest_state(folder)
            if resume_from is None:
                raise FileNotFoundError(f"--resume: {display_path(folder.path)} holds no saved state to resume from")
        if resume_from is not None:
            resume_from = run_path(resume_from)
            if not resume_from.is_file():
                raise FileNotFoundError(f"--resume-from {resume_from}: no such state file (states are in <run>/states/)")
            data.check_path_access("learning", resume_from)
        start_file = Path(start_file or warm_start_file(config.name))
        data.check_path_access("learning", start_file)
        began = time.perf_counter()
        loop = start_loop(config, G, total_iterations, start_file, sampler,
                          device or models.default_device(config.name), variant, shared_prompts, learned_verifier)
        first_iteration, first_in_folder = _prepare_folder(folder, loop, resume_from, restart or overwrite,
                                                           stop_after)
        state_files = _iterate(folder, loop, first_iteration, end_iteration, save_states_at, sampler, progress,
                               CheckpointCurves(loop, total_iterations))
        summary = {"iterations_run": [first_iteration, end_iteration], "state_files": state_files,
                   "seconds": time.perf_counter() - began}
        if end_iteration < total_iterations:
            write_json(folder / f"stopped-at-{end_iteration:03d}.json", summary)
            return summary
        return finish_run(folder, loop, first_in_folder, resume_from, summary)
    finally:
        folder.release()


def _iterate(folder: RunFolder, loop: Loop, first_iteration: int, end_iteration: int, save_states_at,
             sampler: str, progress: bool, curves: "CheckpointCurves") -> list[dict]:
    """Iterations first_iteration+1..end_iteration, each written to disk as it ends; the states saved
    (requested ones and the last; autosaves come and go).  Ctrl-C: see `run_grpo`."""
    state_files: list[dict] = []
    autosaved: Path | None = None
    last_save = time.monotonic()
    bar = _progress_bar(progress, first_iteration, end_iteration, loop.G)
    with deterministic_algorithms(), _DeferredInterrupt() as interrupt:
        curves.maybe_measure(folder, first_iteration, at_start=True)
        for iteration in range(first_iteration, end_iteration):
            record, rows, timings = run_iteration(loop, iteration, sampler)
            # The iteration's rows go to disk now (appended, synced), before any state counts them.
            folder.append(ROLLOUTS_PART, rows)
            timings["checkpoint"] = curves.maybe_measure(folder, iteration + 1)
            folder.append(TIMINGS_PART, [timings])
            done = iteration + 1
            if done in save_states_at or done == end_iteration:
                state_files.append(save_loop_state(folder, loop, done))
                last_save = time.monotonic()
            elif interrupt.requested or done % AUTOSAVE_ITERATIONS == 0 \
                    or time.monotonic() - last_save > AUTOSAVE_SECONDS:
                saved = save_loop_state(folder, loop, done)
                if autosaved is not None:
                    folder.forget(str(autosaved.relative_to(folder.path)))
                autosaved, last_save = folder / saved["path"], time.monotonic()
            if interrupt.requested and done < end_iteration:
                newest = newest_state(folder)
                raise Interrupted(f"interrupted after iteration {done}: its state is "
                                  f"{display_path(newest)}; continue with the same command and --resume")
            bar.update(1)
            bar.set_postfix(reward=f"{record['reward']:.2f}",
                            kl="no update" if record["kl"] is None else f"{record['kl']:.2e}",
                            zero_std=f"{record['frac_reward_zero_std']:.2f}")
    bar.close()
    if autosaved is not None:  # the run reached its end: the requested states and the last one stay
        folder.forget(str(autosaved.relative_to(folder.path)))
    return state_files


class _DeferredInterrupt:
    """While active (in the main thread), a first Ctrl-C only asks the loop to stop after the current
    iteration, whose state is then saved; a second one interrupts at once."""

    def __init__(self):
        self.requested, self._previous = False, None

    def _handle(self, signum, frame):
        if self.requested:
            raise Interrupted("interrupted during an iteration (Ctrl-C twice): resume from the newest saved state "
                              "with the same command and --resume")
        self.requested = True
        print("\nCtrl-C: finishing this iteration, then saving its state (Ctrl-C again to stop at once)",
              flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class CheckpointCurves:
    """The run's fixed-prompt curves (`labkit.grpo.checkpoint_curves`): a record in checkpoints.jsonl
    at the start and every `checkpoint_every` iterations.  They read the policy and the reference
    and nothing else of the loop (no generator, no optimiser), so they change no weight."""

    def __init__(self, loop: Loop, total_iterations: int):
        self.loop, self.total = loop, total_iterations
        self.every = loop.config.checkpoint_every
        self.fixed = checkpoint_curves.fixed_prompts(loop.config, loop.tokenizer) if self.every else None

    def maybe_measure(self, folder: RunFolder, iteration: int, at_start: bool = False) -> float:
        """Measure after `iteration` if a checkpoint is due; returns the seconds it took (0.0 if none).
        `at_start`: only a run that begins at iteration 0 measures its start (a resume has it)."""
        if at_start and iteration != 0:
            return 0.0
        if not checkpoint_curves.due(iteration, self.total, self.every):
            return 0.0
        t0 = time.perf_counter()
        record = checkpoint_curves.measure(self.loop.model, self.loop.reference, self.loop.tokenizer, self.fixed,
                                           self.loop.config, iteration)
        folder.append(CHECKPOINTS_PART, [record])
        return time.perf_counter() - t0


def read_checkpoints(run_dir: str | Path) -> list[dict]:
    """The fixed-prompt checkpoint records of a GRPO run, in iteration order, checked against its ledger
    ([] for a run made with checkpoint_every 0, whose ledger lists no such part)."""
    folder = RunFolder(run_dir)
    if CHECKPOINTS_PART not in folder.ledger()["parts"]:
        return []
    return folder.read_part(CHECKPOINTS_PART)


def save_loop_state(folder: RunFolder, loop: Loop, iteration: int) -> dict:
    """A full state after `iteration`, carrying the folder's ledger of that boundary as evidence
    (it holds the timings' digest, which differs between runs that computed the same thing, so it
    is not compared); registered in the ledger with its digest."""
    t0 = time.perf_counter()
    path = state_path(folder.path, iteration)
    info = state_lib.save_state(path, loop.capture(iteration), evidence={"ledger": folder.ledger()})
    folder.register(str(path.relative_to(folder.path)), info["sha256"])
    return {**info, "path": str(path.relative_to(folder.path)), "seconds_total": time.perf_counter() - t0}


def finish_run(folder: RunFolder, loop: Loop, first_in_folder: int, resume_from: Path | None, summary: dict) -> dict:
    """The final checks, model, history and manifest; then FINISHED."""
    if loop.reference.training or any(p.requires_grad for p in loop.reference.parameters()):
        raise RuntimeError("the reference left eval mode or gained gradients")
    if models.parameter_digest(loop.reference) != loop.reference_digest:
        raise RuntimeError("the reference changed during the run; it must stay frozen")
    rows = read_rollouts(folder.path)  # checked against the ledger before the run is called finished
    end_iteration = summary["iterations_run"][1]
    if len(rows) != loop.config.prompts_per_iteration * loop.G * (end_iteration - first_in_folder + 1):
        raise RuntimeError(f"{folder}: {len(rows)} rollouts on disk, not one per sampled response")
    final_digest = models.parameter_digest(loop.model)
    models.save_model(loop.model, folder / "model.safetensors")
    device = loop.identity["device"]
    reloaded, _ = models.load(loop.config.name, state=folder / "model.safetensors", device=device)
    if models.parameter_digest(reloaded) != final_digest:
        raise RuntimeError("the saved GRPO model does not reload to the same parameters")
    write_json(folder / "history.json", loop.history)
    folder.register("model.safetensors")
    folder.register("history.json")
    manifest = {
        "step": "grpo",
        "identity": {k: v for k, v in loop.identity.items() if k != "pool_ids"},
        "config": loop.config.to_dict(),
        "code_sha256": code_digests(),
        "data_sha256": data_digests(),
        "environment": environment(device),
        "reference_digest": loop.reference_digest,
        "final_digest": final_digest,
        "rollouts": len(loop.consumed),
        "updates": loop.next_update,
        "resumed_from": str(resume_from) if resume_from else None,
        "first_iteration_in_folder": first_in_folder,
        "generated_tokens": sum(len(r["response_ids"]) for r in rows),
        "ledger": folder.ledger(),
        **summary,
    }
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"final_digest": final_digest})
    return manifest


def _progress_bar(enabled: bool, start: int, end: int, G: int):
    from tqdm.auto import tqdm

    return tqdm(total=end, initial=start, desc=f"GRPO G={G}", unit="it", disable=not enabled, leave=False)


# A run's parts, named in its ledger; the files a fresh attempt clears (cleanup is the only glob).
ROLLOUTS_PART = "rollouts.jsonl.gz"
TIMINGS_PART = "timings.jsonl"
CHECKPOINTS_PART = "checkpoints.jsonl"
ATTEMPT_FILES = (ROLLOUTS_PART, TIMINGS_PART, CHECKPOINTS_PART, "history.json", "model.safetensors", "manifest.json",
                 "resume_report.json", "stopped-at-*.json", "states/iter-*.pt.gz")


def drop_after(folder: RunFolder, iteration: int, ledger: dict) -> list[str]:
    """Before resuming after `iteration` in the run's own folder: cut the parts back to the state's
    ledger, and remove states and stop markers of later iterations (a later, lost attempt)."""
    later = [p for p in folder.states.glob("iter-*.pt.gz") if int(p.name[5:8]) > iteration]
    later += [p for p in folder.path.glob("stopped-at-*.json") if int(p.stem.split("-")[-1]) > iteration]
    # half-written files of a killed write (atomic_write_bytes' temporaries): never read, only disk
    later += list(folder.path.glob(".*.tmp")) + list(folder.states.glob(".*.tmp"))
    for path in later:
        path.unlink()
    return [str(p.relative_to(folder.path)) for p in later] + folder.restore(ledger)


def read_rollouts(run_dir: str | Path) -> list[dict]:
    """Every rollout of a GRPO run folder, in iteration order, checked against the folder's ledger.

    The ledger (the manifest's, once the run is finished) gives the rows and digest of
    rollouts.jsonl.gz; the rows must come in consecutive iterations with no id twice.
    Anything else is refused (ArtifactError naming the file)."""
    folder = RunFolder(run_dir)
    rows = folder.read_part(ROLLOUTS_PART)
    ids = [r["rollout_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ArtifactError(f"{folder / ROLLOUTS_PART}: {len(ids) - len(set(ids))} rollout ids appear twice")
    iterations = sorted({r["iteration"] for r in rows})
    if iterations and iterations != list(range(iterations[0], iterations[-1] + 1)):
        raise ArtifactError(f"{folder / ROLLOUTS_PART}: iterations {iterations[0]}..{iterations[-1]} have gaps")
    return rows


def read_timings(run_dir: str | Path) -> list[dict]:
    """The wall-clock times of each iteration (evidence only: never compared between runs)."""
    return RunFolder(run_dir).read_part(TIMINGS_PART)


# -- 7. Exact resume: stop, resume in a fresh process, compare with the continuous run --------


def resume_check(
    config: PresetConfig | str,
    *,
    group_size: int | None = None,
    stop_at: int = 40,
    run_dir: str | Path | None = None,
    scratch_dir: str | Path | None = None,
    sampler: str = "reference",
    device: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Continuous run vs stop-after-`stop_at` + resume, each in a fresh `python -m labkit grpo`
    process (`labkit.lab.resume`): the end states (model, AdamW, schedule position, prompt order,
    generation RNG, system RNGs, history, consumed ids), the final model files and the rollouts
    of the resumed iterations must all be equal.  Report: `run_dir/resume_report.json`."""
    import subprocess
    import sys

    from ..lab import resume
    from ..lab.runs import sha256_file

    config = get_preset(config) if isinstance(config, str) else config
    G = group_size or config.group_size
    run_dir = Path(run_dir or default_run_dir(config.name, G))
    if not is_finished(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a finished run; the check compares against it")
    continuous = read_json(run_dir / "manifest.json")
    total = continuous["identity"]["iterations"]
    resume.check_preconditions(run_dir, continuous, state_path(run_dir, total), run_dir / "resume_report.json",
                               overwrite)
    if not 0 < stop_at < total:
        raise ValueError(f"stop_at must lie in 1..{total - 1}, got {stop_at}")
    threads = continuous["environment"]["torch_threads"]
    command = [sys.executable, "-m", "labkit", "grpo", "--preset", config.name, "--group-size", str(G),
               "--iterations", str(total), "--threads", str(threads), "--sampler", sampler, "--no-progress",
               *(["--device", device] if device else [])]

    def stop(folder: Path) -> Path:
        subprocess.run(command + ["--run-dir", str(folder), "--stop-after", str(stop_at)], check=True, cwd=REPO_ROOT)
        return state_path(folder, stop_at)

    def resume_into(folder: Path, boundary: Path) -> None:
        subprocess.run(command + ["--run-dir", str(folder), "--resume-from", str(boundary)], check=True, cwd=REPO_ROOT)

    def extras(folder: Path, is_continuous: bool) -> dict:
        # the final model file, and the rollouts of the resumed iterations, every field
        rows = read_rollouts(folder)
        return {"final_model_sha256": sha256_file(folder / "model.safetensors"),
                "rollouts_after_stop": [r for r in rows if r["iteration"] > stop_at] if is_continuous else rows}

    return resume.run_resume_check(resume.ResumeCheck(
        run_dir=run_dir,
        scratch_dir=Path(scratch_dir or REPO_ROOT / "runs" / "scratch" / config.name / run_dir.name),
        end_state=lambda folder: state_path(folder, total), stop=stop, resume=resume_into, extras=extras,
        boundary=f"after iteration {stop_at} of {total} (both updates done, state saved)",
        facts={"preset": config.name, "group_size": G}, continuous_seconds=continuous["seconds"],
        extra_work={"extra_iterations": total},
    ), threads)
