"""One GRPO iteration, the core of the lab: sample, score, advantages, the objective, the update.

    role       what it is                                            gradients
    reference  a copy reloaded exactly from the warm-start file      never (frozen, digest re-checked)
    old        the policy that sampled an iteration's rollouts;      never (log-probs recorded
               its log-probs are recorded at sampling time            at sampling, never replaced)
    current    the policy being optimised                            yes

One iteration, in the order of the code below (book/protocol.md, "GRPO"), read from `run_iteration`
at the end of this file down:

    1. take the next 4 prompts of a seeded permutation of the 872-problem pool (`draw_prompts`)
    2. sample G responses to each with the old policy (= current before its updates)
    3. score them with the verifier; group advantages A = (r - mean) / (std + 1e-8) (`sample_iteration`)
    4. check that full-sequence scoring reproduces the recorded log-probs (within 2e-4)
    5. two updates on the same rollouts: clipped surrogate + 0.02 x exact prefix KL,
       AdamW, grad-norm clip 1, warm-up then linear decay of the learning rate
       (`update_iteration` -> `grpo_update` -> `grpo_loss` -> `losses.clipped_surrogate`)
    6. the iteration's log record and its raw rollouts (`record_iteration`)

Eval mode throughout (dropout off): it does not forbid autograd.  No critic.
Zero-variance groups are counted and contribute no surrogate gradient; no reward
is ever invented to break them.  A variant of the objective (`labkit.grpo.variants`) comes in
resolved, once: this module calls what `Loop.resolved` holds and never looks a switch up.

The run around the iterations (its folder, states, autosave, Ctrl-C, resume) is `labkit.grpo.loop`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..lab import state as state_lib
from ..task import data, problems
from ..config import SEED_OFFSETS, PresetConfig
from ..models import presets, rollouts, sampling, scoring, shared_prompt
from ..train.schedule import clipped_step, warmup_linear_decay
from . import losses, variants
from .variants import Resolved

# The prompt order and the sampling seeds come from two generators of their own,
# seeded apart from each other and from the SFT branches.
PROMPT_ORDER_SEED_OFFSET = SEED_OFFSETS["grpo_prompt_order"]
GENERATION_SEED_OFFSET = SEED_OFFSETS["grpo_generation"]
SEED_RANGE = 2**62


# -- 1. The prompt pool and its order ----------------------------------------------------------


def load_pool() -> list[dict]:
    """The 872 pool problems (train minus the warm-start set), statements joined with labels.

    Read in the learning phase: test statements and labels are refused by `labkit.task.data`.
    """
    statements = data.open_records("statements", "train", "learning")
    labels = {r["id"]: r for r in data.open_records("labels", "train", "learning")}
    pool = set(problems.pool_ids(statements))
    return [{**s, **labels[s["id"]]} for s in statements if s["id"] in pool]


def protocol_pool(tokenizer, config: PresetConfig) -> tuple[list[dict], dict[str, list[int]]]:
    """(the pool, {problem id: prompt token ids}): the protocol's task (`labkit.grpo.tasks`)."""
    pool = load_pool()
    return pool, {r["id"]: scoring.build_prompt_ids(tokenizer, r["statement"], config.max_prompt_tokens) for r in pool}


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
                  iteration: int, sampler: str, max_new_tokens: int, task, stem_tag: str = "") -> list[sampling.Group]:
    """G responses to each chosen problem, sampled by the current (= old) policy in one sampler call.

    chosen: the iteration's P pool problems; seeds: P x G, prompt-major.  Each group is
    verified against its problem by the task's verifier (`labkit.task.verifier` for the protocol;
    the model never sees the labels) and rewarded by the task's reward (`labkit.grpo.tasks`).
    stem_tag: appended to each group's id stem (dynamic sampling's extra draws: "-d1", ...).
    """
    return sampling.sample_groups(
        model, tokenizer, [(p["id"], prompts[p["id"]], p["problem"]) for p in chosen], G, seeds, sampler=sampler,
        max_new_tokens=max_new_tokens, policy_digest=presets.parameter_digest(model),
        rollout_ids=[f"{stem}{stem_tag}-{j}" for stem in group_stems(chosen, G, iteration) for j in range(G)],
        verify=task.verify, reward=task.reward,
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


def iteration_metrics(rows: list[dict], valid: list[bool], G: int) -> dict:
    """The per-iteration figures of the log, from the iteration's rollout rows (prompt-major groups).

    A group is `G` consecutive rows, identified by its position in the iteration, never
    by its problem id: when the prompt order wraps into a new permutation inside one iteration,
    the same problem can be drawn twice, and its two groups stay two groups.

    reward                      mean reward over the P x G rollouts
    reward_std                  mean over groups of the group's reward std (population, ddof 0)
    frac_reward_zero_std        share of groups whose rewards are all equal (no signal)
    valid_json                  share of responses that are schema-valid answers (`valid`)
    completions/mean_length     mean response length in tokens, EOS included
    completions/clipped_ratio   share of responses cut at the token limit (finish_reason "length")
    """
    if G < 1 or len(rows) % G:
        raise ValueError(f"{len(rows)} rollout rows do not split into groups of {G}")
    rewards = torch.tensor([float(r["reward"]) for r in rows]).reshape(-1, G)  # (P, G)
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
    """scorer(model) -> (logp (B, R), logits (B, R, V)): one forward over each full row (the protocol's)."""
    return lambda model: scoring.response_logprobs(model, batch, return_logits=True)


def shared_prompt_scorer(prompts: list[list[int]], responses: list[list[int]], G: int, pad_id: int, *,
                         limits=scoring.LIMITS, bucket_tokens: int | None = None):
    """scorer(model) -> the same (B, R), (B, R, V) as `plain_scorer`, each of the P prompts computed once
    for its G responses (`labkit.models.shared_prompt`; equal within float32 rounding).  prompts: P x G rows.
    bucket_tokens: the responses run in buckets of similar length, not padded to the longest (None: one batch)."""
    return lambda model: shared_prompt.shared_response_logprobs(model, prompts[::G], responses, G, pad_id,
                                                                return_logits=True, limits=limits,
                                                                bucket_tokens=bucket_tokens)


def reference_scores(reference, batch: scoring.Batch, scorer=None) -> tuple[torch.Tensor, torch.Tensor]:
    """ref_scores = (logp_ref (B, R), logits_ref (B, R, V)) of the frozen `reference` policy: one forward per
    iteration, shared by its updates (the reference and the batch do not change between them).
    scorer: `plain_scorer` (the default) or `shared_prompt_scorer`."""
    with torch.no_grad():
        return (scorer or plain_scorer(batch))(reference)


@dataclass
class Rows:
    """What an iteration's updates learn from: B rows (the rollouts, P prompts x G responses, prompt-major,
    for GRPO; RFT's and SFT's own rows), fixed across the iteration's updates."""

    batch: scoring.Batch
    """the rows' token ids and their response mask (B, R)"""
    scorer: Callable
    """scorer(model) -> (logp (B, R), logits (B, R, V)): `plain_scorer(batch)` or `shared_prompt_scorer`"""
    loss_mask: torch.Tensor
    """(B, R) the tokens the loss sees: the response mask, less what a filter takes out"""
    G: int | None
    """responses per prompt, for the reduction; None: the rows are one group (RFT, SFT)"""
    logp_old: torch.Tensor | None = None
    """(B, R) the old policy's log-probs (the sampler's record), None for an objective without a ratio"""
    advantages: torch.Tensor | None = None
    """(B,) float64, one per row; None for an objective without an advantage"""
    token_weights: torch.Tensor | None = None
    """(B, R) truncated importance sampling's weights, or None"""

    @classmethod
    def of_rollouts(cls, batch: scoring.Batch, logp_old: torch.Tensor, advantages: torch.Tensor, G: int) -> "Rows":
        """The protocol's rows: the rollouts themselves, every response token in the loss, scored plainly."""
        return cls(batch=batch, scorer=plain_scorer(batch), loss_mask=batch.response_mask, G=G, logp_old=logp_old,
                   advantages=advantages)


def grpo_loss(batch: variants.LossBatch, resolved: Resolved) -> tuple[torch.Tensor, dict]:
    """Loss = the objective's term + kl_coef x its KL term (both from `resolved`: for the protocol, the
    clipped surrogate `losses.clipped_surrogate` and the exact per-prefix KL `losses.exact_prefix_kl`,
    each reduced token -> response -> prompt).

    batch: the loss's one record (`variants.LossBatch`: the current policy's log-probs and logits with
    gradients, the reference's, logp_old, the advantages, the masks).  The logged `kl`, `kl_k3` and
    `entropy` are always the protocol's measures, a sequence mean over every response token, whatever
    the loss's reduction and whatever a filter takes out of the loss.  Returns (loss 0-d, metrics).
    """
    term, term_stats = resolved.objective.term(batch.logp, batch.logp_old, batch.advantages, batch.mask, G=batch.G,
                                               token_weights=batch.token_weights)
    penalty, exact, k3 = resolved.kl_term(batch)
    loss = term + resolved.kl_coef * penalty
    with torch.no_grad():
        entropy = batch.measure(losses.token_entropy(batch.logits.detach()))
    metrics = {"loss": float(loss.detach()), "surrogate": float(term.detach()), "kl": float(exact.detach()),
               "kl_k3": float(k3.detach()), "entropy": float(entropy), **term_stats}
    return loss, metrics


def grpo_update(model, optimizer, rows: Rows, ref_scores: tuple[torch.Tensor, torch.Tensor], lr: float,
                resolved: Resolved, grad_clip: float, before_step=None) -> dict:
    """One AdamW update of the loss (`grpo_loss`) on `rows` at learning rate `lr`, the gradient's norm
    clipped to `grad_clip` (`schedule.clipped_step`); returns its metrics.

    One forward of the current policy (`rows.scorer`); ref_scores: the frozen reference's (`reference_scores`).
    `before_step(logp_cur)` (detached, (B, R)) runs after it and before anything changes the weights:
    the loop passes the pre-update check there, so the check costs no forward of its own.
    resolved: the run's variant, resolved once (`variants.resolve`; the protocol's is
    `variants.resolve(Variant(), config)`)."""
    optimizer.zero_grad(set_to_none=True)
    logp_cur, logits_cur = rows.scorer(model)  # (B, R), (B, R, V)
    if before_step is not None:
        before_step(logp_cur.detach())
    device = logp_cur.device
    on_device = lambda t: None if t is None else t.to(device)  # noqa: E731  (RFT and SFT have no logp_old)
    batch = variants.LossBatch(logp=logp_cur, logits=logits_cur, logp_ref=ref_scores[0], logits_ref=ref_scores[1],
                               mask=rows.loss_mask.to(device), measure_mask=rows.batch.response_mask.to(device),
                               G=rows.G, logp_old=on_device(rows.logp_old), advantages=on_device(rows.advantages),
                               token_weights=on_device(rows.token_weights))
    loss, metrics = grpo_loss(batch, resolved)
    grad_norm = clipped_step(optimizer, loss, lr, grad_clip)
    return {**metrics, "grad_norm": grad_norm, "learning_rate": lr}


# -- 4. The loop's state and its start ----------------------------------------------------------


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
        "logp_old": list(r.logp_old),
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
    resolved: Resolved  # the run's variant, resolved once (labkit.grpo.variants.resolve)
    task: object  # what the run learns: its pool, verifier, reward, records (labkit.grpo.tasks.Task)
    shared_prompts: bool = False  # score each prompt once per group in the updates (labkit.models.shared_prompt)
    bucket_tokens: int | None = None  # with shared_prompts: responses scored in buckets of similar length
    history: list[dict] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    next_update: int = 0

    @property
    def generators(self) -> dict[str, torch.Generator]:
        """Every generator the run draws from (saved in every state): the sampling seeds', the variant's."""
        return {"generation": self.generation, **self.resolved.generators}

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


def new_loop(config: PresetConfig, G: int, total_iterations: int, model, reference, tokenizer, start_digest: str, *,
             start_label: str, sampler: str, device: str, resolved: Resolved, task, shared_prompts: bool = False,
             bucket_tokens: int | None = None, extra_identity: dict | None = None) -> Loop:
    """Stage 0 after the two loads: AdamW, the pool and its prompts, the seeded streams, the identity.

    resolved: the run's variant, resolved once (`labkit.grpo.variants.resolve`); task: what the run learns
    (`labkit.grpo.tasks.Task`: its pool and prompts here)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.grpo_lr,
                                  weight_decay=config.grpo_weight_decay)
    pool, prompts = task.pool(tokenizer, config)
    identity = {
        "preset": config.name, "config_fingerprint": config.fingerprint(), "G": G,
        "iterations": total_iterations, "sampler": sampler, "device": device,
        "torch_threads": torch.get_num_threads(), "start_file": start_label,
        "start_digest": start_digest, "pool_ids": [r["id"] for r in pool],
        **resolved.identity,  # {} for the protocol
        **({"scoring": "shared_prompt"} if shared_prompts else {}),  # the plain path stays unnamed
        **({"bucket_tokens": bucket_tokens} if bucket_tokens is not None else {}),
        **task.identity,  # {} for the protocol
        **(extra_identity or {}),
    }
    return Loop(config=config, G=G, model=model, reference=reference, tokenizer=tokenizer, optimizer=optimizer,
                pool=pool, prompts=prompts,
                order=PromptOrder(len(pool), config.seed + PROMPT_ORDER_SEED_OFFSET),
                generation=torch.Generator().manual_seed(config.seed + GENERATION_SEED_OFFSET), identity=identity,
                total_updates=total_iterations * resolved.updates_per_iteration, reference_digest=start_digest,
                resolved=resolved, task=task, shared_prompts=shared_prompts, bucket_tokens=bucket_tokens)


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
                           config.max_new_tokens, loop.task)
    optimised = loop.resolved.optimised_reward(groups)  # (P, G): the verifier's rewards, or the variant's
    # the variant's groups: these (the protocol), or with silent groups replaced (dynamic sampling)
    chosen, groups, optimised, dynamic = loop.resolved.refill(
        chosen, groups, optimised, loop.config.prompts_per_iteration,
        lambda tag: draw_and_sample(loop, policy, iteration, sampler, tag))
    seconds = time.perf_counter() - t0
    advantages = loop.resolved.advantages(optimised).reshape(-1)  # (P x G,) prompt-major
    sampled = Sampled(chosen=chosen, groups=groups, optimised=optimised, advantages=advantages, seconds=seconds,
                      dynamic=dynamic)
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
                           loop.config.max_new_tokens, loop.task, stem_tag=stem_tag)
    return chosen, groups, loop.resolved.optimised_reward(groups)


def draw_prompts(loop: Loop) -> tuple[list[dict], list[int]]:
    """Stage 1: the next P problems of the pool's permutation and the P x G sampling seeds."""
    P, G = loop.config.prompts_per_iteration, loop.G
    chosen = [loop.pool[i] for i in loop.order.take(P)]
    seeds = torch.randint(0, SEED_RANGE, (P * G,), generator=loop.generation).tolist()
    return chosen, seeds


def solver_target_rows(loop: Loop, s: Sampled) -> tuple[list[list[int]], list[list[int]]]:
    """The solver's target for each chosen prompt (what objective "sft" learns from)."""
    return ([loop.prompts[p["id"]] for p in s.chosen],
            [scoring.target_response_ids(loop.tokenizer, p["target"]) for p in s.chosen])


def row_limits(config: PresetConfig) -> tuple[int, int, int]:
    """(prompt, response, row) token limits of the updates' rows: as long as the protocol allows, or the
    run's own limit where it is longer (worked answers: 160); the solver's targets (objective "sft") are
    never longer than the protocol's 64."""
    response_limit = max(config.max_new_tokens, scoring.MAX_NEW_TOKENS)
    return config.max_prompt_tokens, response_limit, config.max_prompt_tokens + response_limit


def learning_rows(loop: Loop, s: Sampled) -> Rows | None:
    """The rows the iteration's updates learn from, as the objective picks them (GRPO: the rollouts with
    their recorded logp_old and advantages; RFT: the right ones; SFT: the solver's targets), in one batch
    with its loss mask and scorer; None when nothing is left to learn from (RFT with no right response,
    or every response filtered out)."""
    resolved = loop.resolved
    prompts, responses = resolved.objective.rows(s.rollouts, s.optimised, lambda: solver_target_rows(loop, s))
    if not prompts:
        return None
    limits = row_limits(loop.config)
    batch = scoring.make_batch(prompts, responses, pad_id=loop.tokenizer.pad_token_id, limits=limits)
    loss_mask = resolved.loss_mask(s.rollouts, batch.response_mask)  # (B, R)
    if not loss_mask.any():
        return None
    on_rollouts = resolved.objective.on_rollouts  # the rows are the rollouts: grouped, with a ratio
    return Rows(batch=batch, loss_mask=loss_mask, G=loop.G if resolved.objective.grouped else None,
                scorer=(shared_prompt_scorer(prompts, responses, loop.G, loop.tokenizer.pad_token_id, limits=limits,
                                             bucket_tokens=loop.bucket_tokens)
                        if loop.shared_prompts and on_rollouts else plain_scorer(batch)),
                logp_old=padded([r.logp_old for r in s.rollouts], batch.response_mask.shape[1]) if on_rollouts else None,
                advantages=s.advantages if on_rollouts else None)


def update_iteration(loop: Loop, s: Sampled) -> tuple[list[dict], dict]:
    """Stages 4-5: the rows to learn from, one reference forward, the updates (two in the protocol), the
    pre-update check riding on the first update's own forward, before its step.  (A variant may take
    logp_old from the trainer, or have rows that are not the rollouts: `resolved.logp_old_stage` then runs
    the check itself.)  Returns (the updates' metrics, the check's figures); marks the rollouts as used."""
    config, resolved = loop.config, loop.resolved
    check = {}

    def pre_update_check(logp_cur: torch.Tensor | None = None) -> None:
        """The rollouts' recorded log-probs against a full-sequence forward's (`logp_cur`, else one of its own)."""
        if logp_cur is None:
            logp_cur = scoring.response_logprobs(loop.model, scoring.make_batch(
                [r.prompt_ids for r in s.rollouts], [r.response_ids for r in s.rollouts], pad_id=0,
                limits=row_limits(config)))[0]
        t = time.perf_counter()
        check.update(sampling.compare_with_recorded(logp_cur, s.rollouts, tol=config.logprob_check_tol,
                                                    strict=resolved.strict_logprob_check))
        check["seconds"] = time.perf_counter() - t  # the comparison only: the forward is the update's

    loop.consumed += [r.rollout_id for r in s.rollouts]
    rows = learning_rows(loop, s)
    if rows is None:  # nothing to learn from: no update, but the schedule moves on as if there were
        pre_update_check()
        loop.next_update += resolved.updates_per_iteration
        return [], check
    ref_scores = reference_scores(loop.reference, rows.batch, rows.scorer)
    rows, check_on_first_update, old_stats = resolved.logp_old_stage(rows, loop.model, pre_update_check)
    check.update(old_stats)
    updates = []
    for k in range(resolved.updates_per_iteration):
        lr = warmup_linear_decay(loop.next_update, loop.total_updates, config.grpo_lr, config.warmup_fraction,
                                 config.final_lr_fraction)
        updates.append(grpo_update(loop.model, loop.optimizer, rows, ref_scores, lr, resolved, config.grad_clip,
                                   before_step=check_on_first_update if k == 0 else None))
        loop.next_update += 1
    return updates, check


def record_iteration(loop: Loop, iteration: int, s: Sampled, updates: list[dict], check: dict) -> tuple[dict, list[dict]]:
    """Stage 6: the iteration's log record (`run_iteration` appends it to the loop's history) and its
    rollout rows (the protocol's; another task records its own: `labkit.grpo.tasks`)."""
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
           if loop.resolved.filters_overlong else {}),
        "updates": updates,
        # the figures trainers log, from the last update of the iteration (None: no update ran)
        **{k: updates[-1][k] if updates else None
           for k in ("kl", "entropy", "grad_norm", "learning_rate", "clip_ratio/low_mean", "clip_ratio/high_mean",
                     "clip_ratio/region_mean")},
    }
    return record, rows


def run_iteration(loop: Loop, iteration: int, sampler: str) -> tuple[dict, list[dict], dict]:
    """One iteration (stages 1-6 of the module docstring); returns (its log record, rows, timings)."""
    t_iteration = time.perf_counter()
    sampled = sample_iteration(loop, iteration, sampler)
    t0 = time.perf_counter()
    updates, check = update_iteration(loop, sampled)
    t_optimisation = time.perf_counter() - t0
    record, rows = loop.task.record(loop, iteration, sampled, updates, check)
    loop.history.append(record)
    timings = {"iteration": iteration + 1, "generation": sampled.seconds, "logprob_check": check["seconds"],
               "optimisation": t_optimisation - check["seconds"], "iteration_total": time.perf_counter() - t_iteration,
               # each rollout's generation time, in the rows' order (the source protocol asks for it); wall
               # clock, so kept here beside the rows, never in them (rollouts.jsonl.gz stays comparable)
               "rollout_seconds": [r.seconds for r in sampled.rollouts]}
    return record, rows, timings
