"""Chapter 6, a GRPO run: `check_ch06_iteration_metrics` grades one iteration's logged metrics."""

from __future__ import annotations

from ._calling import ADVANTAGE_NOT_BROADCAST, ExerciseError, call_student, require_function, require_tensor


CH06_KEYS = ("reward", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio")


def _ch06_rows(groups, order="grouped"):
    """Constructed rollout rows (not model outputs): groups = [(problem_id, [(reward, tokens, finish), ...])].

    Each response's text is a fixed 19-character answer whatever its token count, so a
    length counted in characters differs from one counted in tokens.  order "interleaved"
    deals the rows round-robin (first response of every group, then the second, ...).
    """
    per_group = []
    for problem_id, responses in groups:
        rows = []
        for j, (reward, tokens, finish) in enumerate(responses):
            rows.append({"rollout_id": f"constructed-{problem_id}-{j}", "iteration": 1, "problem_id": problem_id,
                         "response_ids": list(range(100, 100 + tokens)), "text": '{"final_stock": 43}',
                         "finish_reason": finish, "reward": float(reward)})
        per_group.append(rows)
    if order == "grouped":
        return [r for rows in per_group for r in rows]
    width = max(len(rows) for rows in per_group)
    return [rows[j] for j in range(width) for rows in per_group if j < len(rows)]


def _ch06_rewards_by_problem(rows) -> dict[str, list[float]]:
    """The iteration's groups: the rewards of the rows sharing a problem_id."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["problem_id"], []).append(float(r["reward"]))
    return groups


def _ch06_reference(rows) -> dict:
    """The logged metrics of one iteration, from its raw rollouts (groups = rows sharing a problem_id)."""
    groups = _ch06_rewards_by_problem(rows)
    return {
        "reward": sum(float(r["reward"]) for r in rows) / len(rows),
        "frac_reward_zero_std": sum(len(set(g)) == 1 for g in groups.values()) / len(groups),
        "completions/mean_length": sum(len(r["response_ids"]) for r in rows) / len(rows),
        "completions/clipped_ratio": sum(r["finish_reason"] == "length" for r in rows) / len(rows),
    }


def _ch06_variants(rows) -> dict:
    """The usual mistakes' answers, {(key, name): value}, to name the one a wrong answer matches."""
    n = len(rows)
    groups = _ch06_rewards_by_problem(rows)
    G = n // len(groups)
    chunks = [[float(r["reward"]) for r in rows[i:i + G]] for i in range(0, n, G)]
    right = _ch06_reference(rows)
    return {
        # checked in this order; case 1 (2 groups with signal, 3 all wrong, 1 all right) tells them all apart
        ("frac_reward_zero_std", "with signal"): 1.0 - right["frac_reward_zero_std"],
        ("frac_reward_zero_std", "all wrong only"): sum(set(g) == {0.0} for g in groups.values()) / len(groups),
        ("frac_reward_zero_std", "all right only"): sum(set(g) == {1.0} for g in groups.values()) / len(groups),
        ("frac_reward_zero_std", "consecutive chunks"): sum(len(set(c)) == 1 for c in chunks) / len(chunks),
        ("completions/mean_length", "characters"): sum(len(r["text"]) for r in rows) / n,
        ("completions/mean_length", "without EOS"): sum(len(r["response_ids"]) - 1 for r in rows) / n,
        ("completions/clipped_ratio", "reward 0"): sum(float(r["reward"]) == 0.0 for r in rows) / n,
        ("completions/clipped_ratio", "eos"): sum(r["finish_reason"] == "eos" for r in rows) / n,
        ("reward", "sum"): sum(float(r["reward"]) for r in rows),
    }


CH06_HINTS = {
    "all wrong only": ("an all-correct group [1, 1, 1, 1] has zero variance too: "
                       "count every group whose rewards are all equal"),
    "all right only": ("an all-wrong group [0, 0, 0, 0] has zero variance too: "
                       "count every group whose rewards are all equal"),
    "with signal": "that is the fraction of groups WITH signal; frac_reward_zero_std counts the constant groups",
    "consecutive chunks": ("a group is the G responses to one prompt: group the rows by problem_id, "
                           "not by consecutive chunks of rows"),
    "characters": "lengths are counted in tokens, len(response_ids), not in characters of the text",
    "without EOS": "the EOS token is part of the response (it is the last id of response_ids and it is scored)",
    "reward 0": ("clipped means cut at the token limit (finish_reason == 'length'), "
                 "not rewarded 0: most wrong answers ended with EOS"),
    "eos": "that is the fraction that ended with EOS; clipped_ratio counts finish_reason == 'length'",
    "sum": "the logged reward is the mean over the iteration's rollouts, not the sum",
}


def _ch06_cases():
    E, L = "eos", "length"
    return [
        ("six groups: two with signal, three all wrong, one all right; one response cut at the limit",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)]),
                     ("p5", [(0, 9, E), (0, 9, E), (0, 9, E), (0, 9, E)]),
                     ("p6", [(0, 11, E), (0, 7, E), (0, 8, E), (0, 9, E)])])),
        ("one group of each kind: [1,0,0,0], [0,0,0,0], [1,1,1,1], [1,1,0,0], one response cut at the limit",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)])])),
        ("every group all wrong",
         _ch06_rows([(f"p{k}", [(0, 5 + k, E)] * 4) for k in range(1, 5)])),
        ("the same groups as the first case, rows dealt round-robin (not grouped)",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)])], order="interleaved")),
        ("one all-right group and three all-wrong ones, rows dealt round-robin",
         _ch06_rows([("p1", [(1, 7, E)] * 4), ("p2", [(0, 9, E)] * 4), ("p3", [(0, 64, L)] * 4),
                     ("p4", [(0, 8, E)] * 4)], order="interleaved")),
        ("G = 2: four groups of two",
         _ch06_rows([("p1", [(1, 7, E), (0, 8, E)]), ("p2", [(1, 7, E), (1, 7, E)]),
                     ("p3", [(0, 64, L), (0, 9, E)]), ("p4", [(0, 6, E), (0, 6, E)])])),
    ]


def _ch06_compare(where: str, got, expected: dict, rows) -> None:
    if not isinstance(got, dict):
        raise ExerciseError(f"{where} returned {type(got).__name__}; return a dict with the keys {list(CH06_KEYS)}")
    missing = [k for k in CH06_KEYS if k not in got]
    if missing:
        raise ExerciseError(f"{where}: the returned dict lacks {missing}; it needs the keys {list(CH06_KEYS)} "
                            "(spelled as in history.json)")
    variants = _ch06_variants(rows)
    for key in CH06_KEYS:
        try:
            value = float(got[key])
        except (TypeError, ValueError):
            raise ExerciseError(f"{where}: {key!r} is {got[key]!r}; it must be a number") from None
        if abs(value - expected[key]) <= 1e-9:
            continue
        names = [name for (k, name), v in variants.items() if k == key and abs(value - v) <= 1e-9]
        hint = CH06_HINTS[names[0]] if names else {
            "reward": "the mean of the rewards of all the iteration's rollouts",
            "frac_reward_zero_std": "the fraction of groups (one per problem_id) whose G rewards are all equal",
            "completions/mean_length": "the mean over rollouts of len(response_ids)",
            "completions/clipped_ratio": "the fraction of rollouts with finish_reason == 'length'",
        }[key]
        raise ExerciseError(f"{where}: {key} = {value!r}, expected {expected[key]!r}. Hint: {hint}.")


def check_ch06_iteration_metrics(iteration_metrics, run_dir=None) -> bool:
    """Grade chapter 6's exercise: `iteration_metrics(rows) -> dict`, one iteration's logged metrics.

    rows: the raw rollouts of ONE iteration (dicts as in rollouts.jsonl.gz, in any order).
    The dict must hold reward (mean reward), frac_reward_zero_std (fraction of groups, one
    per problem_id, whose rewards are all equal), completions/mean_length (mean
    len(response_ids)) and completions/clipped_ratio (fraction with finish_reason
    "length").  Tried first on constructed iterations, then, when `run_dir` names a
    finished GRPO run, on every iteration of it against its history.json (within 1e-9).
    """
    from pathlib import Path

    require_function(iteration_metrics)

    def call(where, rows):
        return call_student(iteration_metrics, [dict(r) for r in rows], where=where)

    cases = _ch06_cases()
    for number, (what, rows) in enumerate(cases, start=1):
        where = f"constructed case {number} of {len(cases)} ({what})"
        _ch06_compare(where, call(where, rows), _ch06_reference(rows), rows)
    message = f"Correct: your iteration_metrics agrees on all {len(cases)} constructed iterations"
    if run_dir is not None:
        from ...grpo.loop import read_rollouts
        from ...lab.runs import read_json

        history = read_json(Path(run_dir) / "history.json")
        rollouts = read_rollouts(run_dir)
        for logged in history:
            rows = [r for r in rollouts if r["iteration"] == logged["iteration"]]
            where = f"iteration {logged['iteration']} of {Path(run_dir).name}"
            if not rows:
                raise ExerciseError(f"{run_dir} holds no rollouts of iteration {logged['iteration']}")
            expected = {k: logged[k] for k in CH06_KEYS}
            _ch06_compare(where + " (compared with history.json)", call(where, rows), expected, rows)
        message += f" and reproduces history.json on all {len(history)} iterations of {Path(run_dir).name}"
    print(message + ".")
    return True


# -- The GRPO loss of one batch ------------------------------------------------------------------------

CH06_LOSS_SIGNATURE = ("grpo_loss(logp_cur (B, T), logp_old (B, T), advantages (B,), mask (B, T), logits_cur (B, T, V), "
                       "logits_ref (B, T, V), G, clip_eps, kl_coef)")


def _ch06_loss_batch(iteration: int | None = None, runs=None) -> dict:
    """One real GRPO batch in float64: an iteration's 16 rollouts of the cached run (4 prompts x G = 4),
    their recorded old log-probs and advantages, scored by the final GRPO model (current) and the
    warm start (reference), so that rho is far from 1 and the clip acts on both sides.

    iteration None: the first iteration on which every named slip gives a loss of its own (the
    responses differ in length, tokens lie on every side of the clip), so each can be named."""
    import torch

    from ...grpo import core, loop
    from ...models import presets, scoring
    from ...config import get_preset
    from ...lab.runs import REPO_ROOT

    runs = runs or REPO_ROOT / "runs" / "tiny"
    config = get_preset("tiny")
    rollouts = loop.read_rollouts(runs / "grpo")
    warm, tokenizer = presets.load("tiny", state=runs / "warm_start" / "model.safetensors")
    final, _ = presets.load("tiny", state=runs / "grpo" / "model.safetensors")
    final, warm = final.double(), warm.double()
    pool = {p["id"]: p for p in core.load_pool()}
    for candidate in ([iteration] if iteration is not None else sorted({r["iteration"] for r in rollouts})):
        rows = [r for r in rollouts if r["iteration"] == candidate]
        if iteration is None and len({len(r["response_ids"]) for r in rows}) == 1:
            continue  # equal lengths: a mean over all tokens would equal the protocol's reduction
        prompts = [scoring.build_prompt_ids(tokenizer, pool[r["problem_id"]]["statement"], config.max_prompt_tokens)
                   for r in rows]
        batch = scoring.make_batch(prompts, [r["response_ids"] for r in rows], pad_id=tokenizer.pad_token_id)
        with torch.no_grad():
            _, logits_cur = scoring.response_logprobs(final, batch, return_logits=True)
            _, logits_ref = scoring.response_logprobs(warm, batch, return_logits=True)
        mask = batch.response_mask.bool()
        b = {"rows": rows, "mask": mask, "logits_cur": logits_cur.double(), "logits_ref": logits_ref.double(),
             "logp_old": core.padded([r["logp_old"] for r in rows], mask.shape[1]).double(),
             "advantages": torch.tensor([r["advantage"] for r in rows], dtype=torch.float64),
             "G": config.G, "clip_eps": config.clip_eps, "kl_coef": config.kl_coef,
             "response_ids": [r["response_ids"] for r in rows]}
        values = sorted(v.item() for v in _ch06_loss_variants(b, b["logits_cur"]).values())
        if iteration is not None or min(y - x for x, y in zip(values, values[1:])) > 1e-6:
            return b
    raise ExerciseError(f"no iteration of {runs / 'grpo'} tells every slip apart; rebuild the cache (`make cache`)")


def _ch06_sampled_logp(logits: "torch.Tensor", response_ids: list[list[int]]) -> "torch.Tensor":
    """(B, T) log-probs of the sampled tokens under `logits` (B, T, V); 0 beyond each response."""
    import torch

    index = torch.zeros(logits.shape[:2], dtype=torch.long)
    for b, ids in enumerate(response_ids):
        index[b, :len(ids)] = torch.tensor(ids)
    mask = torch.zeros(logits.shape[:2], dtype=torch.bool)
    for b, ids in enumerate(response_ids):
        mask[b, :len(ids)] = True
    logp = torch.log_softmax(logits, dim=-1).gather(2, index[:, :, None]).squeeze(2)
    return torch.where(mask, logp, torch.zeros_like(logp))


def _ch06_loss_variants(b: dict, logits_cur: "torch.Tensor") -> dict[str, "torch.Tensor"]:
    """The right loss and the named slips' losses, from the library's pieces, on batch `b`."""
    import torch

    from ...grpo import losses

    logp_cur = _ch06_sampled_logp(logits_cur, b["response_ids"])
    mask, G, eps, beta = b["mask"], b["G"], b["clip_eps"], b["kl_coef"]

    def surrogate(advantages, reduction="sequence", which="min"):
        rho = torch.exp(torch.where(mask, logp_cur - b["logp_old"], torch.zeros_like(logp_cur)))
        A = advantages[:, None]
        terms = {"min": torch.minimum(rho * A, rho.clamp(1 - eps, 1 + eps) * A), "unclipped": rho * A,
                 "max": torch.maximum(rho * A, rho.clamp(1 - eps, 1 + eps) * A)}[which]
        return -losses.reduce(terms, mask, G, reduction)

    def kl(reduction="sequence", backwards=False):
        pair = (b["logits_ref"], logits_cur) if backwards else (logits_cur, b["logits_ref"])
        return losses.reduce(losses.exact_prefix_kl(*pair), mask, G, reduction)

    A = b["advantages"]
    right = surrogate(A) + beta * kl()
    return {
        "right": right,
        "the sign of A is flipped (you pushed up the responses that did worse than their group)":
            surrogate(-A) + beta * kl(),
        "there is no min: you used rho A alone, so nothing stops a token's ratio running away":
            surrogate(A, which="unclipped") + beta * kl(),
        "you took the max of rho A and its clipped version: the min (the pessimistic one) is the rule":
            surrogate(A, which="max") + beta * kl(),
        "you averaged over all the batch's tokens at once: the protocol averages tokens within each response, "
        "then responses within each group, then groups (a long response must not weigh more)":
            surrogate(A, reduction="token") + beta * kl(reduction="token"),
        "the KL is taken the wrong way round: KL(current || reference) sums p_cur (log p_cur - log p_ref) "
        "over the vocabulary": surrogate(A) + beta * kl(backwards=True),
        "the KL term is missing (add kl_coef x the reduced per-prefix KL)": surrogate(A),
        "the KL term has the wrong sign: it is a penalty, added to the loss": surrogate(A) - beta * kl(),
        "you returned the objective, not the loss: the loss is minus the surrogate, plus the KL penalty":
            -surrogate(A) + beta * kl(),
    }


def check_ch06_grpo_loss(grpo_loss, batch: dict | None = None) -> bool:
    """Grade the GRPO-loss exercise: the clipped surrogate reduced token -> response -> prompt, plus
    kl_coef x the exact per-prefix KL(current || reference), on a real batch of the cached run.

    The value must equal `labkit.grpo.core.grpo_loss`'s (the protocol's variant) within 1e-9 (float64) and so must its gradient
    with respect to the current policy's logits; a wrong value is matched against the named slips
    (the sign of A, no min, the max, a mean over all tokens, the KL reversed, missing or of the
    wrong sign, the objective returned instead of the loss)."""
    import torch

    from ...grpo import core, variants
    from ...config import get_preset

    require_function(grpo_loss)
    b = batch or _ch06_loss_batch()
    logits_cur = b["logits_cur"].clone().requires_grad_(True)
    logp_cur = _ch06_sampled_logp(logits_cur, b["response_ids"])
    config = get_preset("tiny").with_overrides(clip_eps=b["clip_eps"], kl_coef=b["kl_coef"])
    logp_ref = _ch06_sampled_logp(b["logits_ref"], b["response_ids"])
    expected, _ = core.grpo_loss(variants.LossBatch(logp=logp_cur, logits=logits_cur, logp_ref=logp_ref,
                                                    logits_ref=b["logits_ref"], mask=b["mask"], measure_mask=b["mask"],
                                                    G=b["G"], logp_old=b["logp_old"], advantages=b["advantages"]),
                                 variants.resolve(variants.Variant(), config))
    (expected_grad,) = torch.autograd.grad(expected, logits_cur, retain_graph=True)  # logp_cur is reused
    rows = len(b["rows"])
    where = f"{CH06_LOSS_SIGNATURE} on iteration {b['rows'][0]['iteration']}'s {rows} real rollouts"
    got = call_student(grpo_loss, logp_cur, b["logp_old"], b["advantages"], b["mask"], logits_cur,
                       b["logits_ref"], b["G"], b["clip_eps"], b["kl_coef"], where=where,
                       on_shape_mismatch=ADVANTAGE_NOT_BROADCAST)
    require_tensor(got, (), "grpo_loss", "the batch's loss as one 0-d tensor (reduce tokens -> responses -> groups)",
                   "your loss", like=logp_cur)
    if abs(got.item() - expected.item()) > 1e-9:
        slips = _ch06_loss_variants(b, logits_cur.detach())
        named = [name for name, value in slips.items()
                 if name != "right" and abs(value.item() - got.item()) <= 1e-9]
        hint = named[0] if named else ("compare each part with the library's: losses.clipped_surrogate and "
                                       "losses.exact_prefix_kl, reduced with losses.reduce_tokens")
        raise ExerciseError(f"{where}: loss {got.item():.9f}, expected {expected.item():.9f}. Hint: {hint}.")
    (grad,) = torch.autograd.grad(got, logits_cur, allow_unused=True)
    if grad is None:
        raise ExerciseError("your loss does not depend on logits_cur: the KL term must be computed from the "
                            "current policy's logits (and logp_cur comes from them too)")
    gap = (grad - expected_grad).abs().max().item()
    if gap > 1e-9:
        raise ExerciseError(f"{where}: the value is right but its gradient with respect to logits_cur is off by up "
                            f"to {gap:.3g}. Hint: did you detach the ratio, or the KL's current-policy side? "
                            "Only logp_old, the advantages and the reference are constants.")
    clipped = int(((torch.exp(logp_cur.detach() - b["logp_old"]) - 1).abs() > b["clip_eps"])[b["mask"]].sum())
    print(f"Correct: your grpo_loss gives {got.item():.6f} on {rows} real rollouts ({int(b['mask'].sum())} tokens, "
          f"{clipped} outside the clip interval), equal to labkit.grpo.core.grpo_loss in value and gradient.")
    return True


# -- Diagnose this: a reference that moves with the policy ----------------------------------------------

CH06_REFERENCE_SIGNATURE = "check_reference(reference, policy, start_digest)"


def _ch06_reference_cases(start_file=None) -> list[tuple[str, object, object, bool]]:
    """[(what the case is, reference, policy, must the check refuse it?)] built from the warm start: the
    protocol's set-up (two separate loads, the reference frozen) and five ways a reference is not
    frozen.  At the start of a run the policy equals the warm start, so every digest agrees."""
    import copy

    from ...models import presets
    from ...lab.runs import REPO_ROOT

    start_file = start_file or REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"

    def load():
        model, _ = presets.load("tiny", state=start_file)
        return model

    def frozen(model):
        for p in model.parameters():
            p.requires_grad_(False)
        return model.eval()

    policy = load().train()
    cases = [("the protocol's set-up: a second load of the warm start, eval mode, no gradients",
              frozen(load()), policy, False)]
    cases.append(("reference = policy: the same object, so every update moves the reference too",
                  policy, policy, True))
    # a new Module object whose submodules (and weights) are the policy's: freezing it froze the policy too
    own_policy = load().train()
    shallow = frozen(copy.copy(own_policy))
    cases.append(("a shallow copy of the policy (copy.copy), then frozen: a new object, but its weight tensors "
                  "ARE the policy's", shallow, own_policy, True))
    trainable = load().eval()  # the weights are right, but an optimizer over all parameters would move them
    cases.append(("a reference whose parameters require grad (an optimizer built from model.parameters() of both "
                  "would move it)", trainable, policy, True))
    moved = frozen(load())
    with __import__("torch").no_grad():
        next(moved.parameters()).add_(1e-3)  # what one step of training with it would do
    cases.append(("a reference whose weights are no longer the warm start's (it was updated, or loaded from the "
                  "wrong file)", moved, policy, True))
    cases.append(("a reference in train mode (dropout, where a model has it, would make its log-probs random)",
                  frozen(load()).train(), policy, True))
    return cases


def check_ch06_frozen_reference(check_reference, start_file=None) -> bool:
    """Grade the diagnose-this exercise of chapter 6: `check_reference(reference, policy, start_digest)`
    must raise AssertionError for a reference that is not a frozen copy of the start, and return
    quietly for the protocol's own.  The cases are real tiny models loaded from the warm start:
    at the start of a run the policy equals it, so a check of digests alone cannot see an alias."""
    from ...models import presets

    require_function(check_reference)
    cases = _ch06_reference_cases(start_file)
    start_digest = presets.parameter_digest(cases[0][1])
    for number, (what, reference, policy, must_refuse) in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({what})"
        returned = []
        refusal = call_student(lambda *args: returned.append(check_reference(*args)), reference, policy, start_digest,
                               where=where, hint="; signal a broken reference with AssertionError (assert ...)",
                               assertion_is_answer=True)
        if refusal is None and returned and returned[0] is False:
            raise ExerciseError(f"{where}: your check returned False; a check signals a broken reference by raising "
                                "AssertionError (assert ...): the loop that calls it ignores what it returns")
        if refusal is not None:
            if not must_refuse:
                said = (str(refusal).splitlines() or ["no message"])[0]
                raise ExerciseError(f"{where}: your check refused the protocol's own reference ({said}); it must "
                                    "pass a separate, frozen load of the warm start")
            continue
        if must_refuse:
            hints = {2: "compare the objects (reference is policy) and their weights' storage: the digests are "
                        "equal at the start, when the policy has not moved yet",
                     3: "compare the parameters' storage (p.data_ptr()): a shallow copy is a new object whose "
                        "tensors are the policy's",
                     4: "check that no reference parameter requires grad",
                     5: "compare the reference's digest (presets.parameter_digest) with start_digest",
                     6: "check that the reference is in eval mode (reference.training is False)"}
            raise ExerciseError(f"{where}: your check let it through. Hint: {hints[number]}.")
    print(f"Correct: your check passes the protocol's frozen reference and refuses all {len(cases) - 1} broken ones "
          "(the alias and the shallow copy have the start's digest: only identity and storage tell).")
    return True
