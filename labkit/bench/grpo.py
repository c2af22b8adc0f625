"""Benchmark: where one GRPO iteration's time goes, and the faster paths against what a user has.

Everything is measured side by side in this one process, on the tiny preset (the warm start
when it exists, else the committed base, else a random-init tiny model, said so), so only the
ratios mean anything on a shared machine.  Each timing is the best of `--repeats`, the methods
alternating within a repeat so that a change in the machine's load hits them alike.

1. Sampling the 16 rollouts of one iteration (4 prompts x G = 4, temperature 1, at most 64
   new tokens): the reference sampler (the protocol's, no KV cache), the fast sampler
   (transformers' forward with its cache), the static sampler (`labkit.models.static_sampler`) and
   transformers' own `generate(use_cache=True, do_sample=True)` batched over the same left-
   padded prompts with the full distribution (top_k=0, top_p=1; it draws from torch's global
   generator, so its tokens are not the reference's).  Then 16 distinct prompts, greedy,
   where no prompt is shared.  The static and fast samplers' tokens are compared with the
   reference sampler's.
2. The floor: the multiply-adds per generated token, the throughput one decode step of the
   static sampler reaches, and what this machine's matrix product reaches on large matrices.
3. The updates' forward and backward, plain (every row its full prompt) against shared-prompt
   scoring (`labkit.models.shared_prompt`), on real rollouts at G = 4 and 8, with the bytes each path
   keeps for the backward pass (its activation memory, counted by a saved-tensors hook).
4. One real iteration of the loop (`core.run_iteration`) in three set-ups, the protocol's
   (reference sampler, plain scoring), the fast sampler with shared scoring, and the static
   sampler with shared scoring (`grpo --sampler static --scoring shared`), split into
   generation, reference forward, updates, pre-update check and bookkeeping.

5. A worked-answer iteration (chapter 11): the thinking base "skill" (`labkit.studies.thinking_base`,
   local: `cache fill` builds it; else the rarer bases' own, `labkit.studies.rarer_bases`) answers 16
   worked prompts x G = 8 at up to 160 new tokens; the static sampler against `generate()` and the
   fast sampler, the arithmetic floor at that context, and one iteration of `labkit.studies.reasoning`
   split into sampling and updates: today's path against the new one, stage by stage, then the new one
   at two threads where the machine has two cores (the same rollouts, checked).  Skipped, said so,
   where no skill base is built.

    python -m labkit bench grpo [--threads 1] [--repeats 3] [--quick]

`--quick` is the smoke `make test` runs: 8 new tokens, one repeat, G = 4 only.  Its numbers
are printed, never asserted as times.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..config import TINY, ReasoningConfig
from ..models import presets, rollouts, sampling, scoring, shared_prompt
from ..models.static_sampler import StaticDecoder, sample_static
from ..grpo import core, variants
from ..grpo.loop import start_loop
from .sampling import bench_prompts, load_bench_model

WARM_START = presets.REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"


def load_model():
    """(model, tokenizer, description): the tiny warm start if built, else `bench.sampling`'s choice."""
    if WARM_START.is_file():
        model, tokenizer = presets.load("tiny", state=WARM_START, device="cpu")
        return model, tokenizer, f"tiny warm start ({WARM_START.relative_to(presets.REPO_ROOT)})"
    return load_bench_model()


def best_of(methods: dict, repeats: int) -> tuple[dict, dict]:
    """({name: best seconds}, {name: last result}): each repeat runs every method once, the order
    reversed on every other repeat."""
    best, results = {name: float("inf") for name in methods}, {}
    for i in range(repeats):
        order = list(methods.items())
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def generate_rows(model, tokenizer, prompts: list[list[int]], greedy: bool, max_new_tokens: int) -> list[list[int]]:
    """transformers' batched `generate()` with its KV cache over left-padded prompts; the new ids of each row."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (P - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    sampling_options = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, use_cache=True,
                             eos_token_id=eos, pad_token_id=pad, **sampling_options)
    rows = []
    for row in out[:, P:].tolist():
        rows.append(row[:row.index(eos) + 1] if eos in row else row)
    return rows


def agreement(reference: list[rollouts.Rollout], other: list[rollouts.Rollout]) -> str:
    same = sum(r.response_ids == o.response_ids for r, o in zip(reference, other))
    return f"{same}/{len(reference)} rollouts token-identical to the reference sampler's"


def bench_sampling(model, tokenizer, max_new_tokens: int, repeats: int) -> dict:
    """Section 1: the four samplers on one iteration's rollouts, then distinct greedy prompts."""
    _, prompts = bench_prompts(tokenizer, 16)
    digest = presets.parameter_digest(model)
    out = {}
    for case, rows, seeds, greedy in (
        ("one iteration: 4 prompts x G=4, sampled", [p for p in prompts[:4] for _ in range(4)], list(range(16)), False),
        ("16 distinct prompts, greedy", prompts, None, True),
    ):
        common = dict(greedy=greedy, max_new_tokens=max_new_tokens, policy_digest=digest)
        torch.manual_seed(0)
        methods = {
            "reference": lambda: sampling.sample_reference(model, tokenizer, rows, seeds, **common),
            "fast": lambda: sampling.sample_fast(model, tokenizer, rows, seeds, **common),
            "static": lambda: sample_static(model, tokenizer, rows, seeds, **common),
            "generate()": lambda: generate_rows(model, tokenizer, rows, greedy, max_new_tokens),
        }
        for fn in methods.values():  # warm-up: first calls pay one-off costs that are not sampling
            fn()
        seconds, results = best_of(methods, repeats)
        tokens = sum(len(r.response_ids) for r in results["reference"])
        print(f"\n[1] sampling, {case}: {len(rows)} rollouts, {tokens} tokens (reference sampler's)")
        for name, s in seconds.items():
            print(f"    {name:<11} {s:8.3f} s   {tokens / s:8.0f} tokens/s")
        print(f"    static is {seconds['generate()'] / seconds['static']:.2f}x generate(), "
              f"{seconds['reference'] / seconds['static']:.2f}x the reference sampler, "
              f"{seconds['fast'] / seconds['static']:.2f}x the fast sampler; "
              f"fast is {seconds['generate()'] / seconds['fast']:.2f}x generate()")
        print(f"    static: {agreement(results['reference'], results['static'])}; "
              f"fast: {agreement(results['reference'], results['fast'])}")
        out[case] = {"seconds": seconds, "tokens": tokens,
                     "static_identical": sum(r.response_ids == s.response_ids
                                             for r, s in zip(results["reference"], results["static"])),
                     "rollouts": len(rows)}
    return out


def multiply_adds_per_token(model, context: int) -> int:
    """Multiply-adds of one new token: every weight matrix once (the head included, the embedding
    lookup not), plus attention's q.k and weights.v over `context` cached positions."""
    config = model.config
    matrices = sum(p.numel() for name, p in model.named_parameters() if name.endswith("proj.weight"))
    head = model.lm_head.weight.numel()
    head_dim = config.hidden_size // config.num_attention_heads
    attention = 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * context
    return matrices + head + attention


def bench_floor(model, repeats: int) -> dict:
    """Section 2: the arithmetic of one token against what one decode step and a large matmul reach."""
    B, context = 16, 72
    decoder = StaticDecoder(model, B, context + 8)
    with torch.no_grad():
        decoder.prefill(torch.zeros((B, context), dtype=torch.long), torch.ones((B, context), dtype=torch.bool))
        step_times = []
        for _ in range(max(3, repeats * 2)):
            start = time.perf_counter()
            decoder.step(torch.zeros(B, dtype=torch.long))
            step_times.append(time.perf_counter() - start)
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        a @ b
        start = time.perf_counter()
        a @ b
        matmul_s = time.perf_counter() - start
    macs = multiply_adds_per_token(model, context)
    step = min(step_times)
    step_rate, peak_rate = 2 * macs * B / step, 2 * 1024 ** 3 / matmul_s
    floor = 2 * macs * B / peak_rate
    print(f"\n[2] the floor: {macs / 1e6:.2f} M multiply-adds per token ({2 * macs / 1e6:.2f} MFLOP) at a "
          f"{context}-token context")
    print(f"    one static decode step of {B} rows: {step * 1e3:.2f} ms = {step_rate / 1e9:.2f} GFLOP/s; "
          f"a 1024x1024 matmul here: {peak_rate / 1e9:.1f} GFLOP/s, so the arithmetic alone needs "
          f"{floor * 1e3:.3f} ms ({step / floor:.0f}x less than the step: at this size a step is "
          "per-operation overhead, not arithmetic)")
    return {"macs_per_token": macs, "step_s": step, "step_gflops": step_rate / 1e9, "matmul_gflops": peak_rate / 1e9}


class SavedBytes:
    """Bytes of the tensors autograd keeps for the backward pass while active (each storage once)."""

    def __init__(self):
        self.storages = {}

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def saved_bytes(fn) -> int:
    meter = SavedBytes()
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
        fn()
    return meter.total


def bench_updates(model, tokenizer, group_sizes: tuple[int, ...], max_new_tokens: int, repeats: int) -> dict:
    """Section 3: plain against shared-prompt forward + backward on real rollouts."""
    _, prompts = bench_prompts(tokenizer, 4)
    pad = tokenizer.pad_token_id
    out = {}
    for G in group_sizes:
        rows = [p for p in prompts for _ in range(G)]
        rollouts = sample_static(model, tokenizer, rows, list(range(len(rows))), max_new_tokens=max_new_tokens,
                                 policy_digest="bench")
        responses = [r.response_ids for r in rollouts]
        report = shared_prompt.benchmark(model, prompts, responses, G, pad, repeats=repeats)
        batch = scoring.make_batch(rows, responses, pad)
        mask = batch.response_mask.float()
        memory = {
            "plain": saved_bytes(lambda: shared_prompt._example_loss(
                *scoring.response_logprobs(model, batch, return_logits=True), mask)),
            "shared": saved_bytes(lambda: shared_prompt._example_loss(
                *shared_prompt.shared_response_logprobs(model, prompts, responses, G, pad, return_logits=True), mask)),
        }
        model.zero_grad(set_to_none=True)
        tokens = sum(len(p) + len(r) for p, r in zip(rows, responses))
        print(f"\n[3] updates' forward + backward, G={G}: {len(rows)} rows, {tokens} tokens "
              f"(prompts {sum(map(len, rows))}, responses {sum(map(len, responses))})")
        print(f"    plain  {report['plain_s']:7.3f} s   {tokens / report['plain_s']:8.0f} tokens/s   "
              f"saved for backward {memory['plain'] / 2**20:7.1f} MiB")
        print(f"    shared {report['shared_s']:7.3f} s   {tokens / report['shared_s']:8.0f} tokens/s   "
              f"saved for backward {memory['shared'] / 2**20:7.1f} MiB")
        # What sharing can save at most: the plain path runs every row's prompt and response through
        # the model; the shared one each prompt once and the responses (less their last token).
        shared_tokens = sum(map(len, prompts)) + sum(max(len(r) - 1, 0) for r in responses)
        bound = tokens / shared_tokens
        print(f"    shared is {report['ratio']:.2f}x the plain path, with {memory['plain'] / memory['shared']:.2f}x "
              f"less activation memory; log-probs agree within {report['max_abs_logp_diff']:.1e}")
        print(f"    bound from the token counts: {tokens} / {shared_tokens} = {bound:.2f}x (both paths also share "
              f"the output layer and the loss over {sum(map(len, responses))} response positions, so less)")
        out[G] = {**report, "saved_bytes": memory, "token_bound": bound}
    return out


def bench_iteration(max_new_tokens: int, start_file: Path) -> dict:
    """Section 4: one real iteration of the loop, the protocol's set-up against the fast one."""
    config = TINY.with_overrides(max_new_tokens=max_new_tokens)
    out = {}
    for name, sampler, shared in (("protocol (reference sampler, plain)", "reference", False),
                                  ("fast sampler, shared-prompt scoring", "fast", True),
                                  ("static sampler, shared-prompt scoring", "static", True)):
        loop = start_loop(config, config.G, 1, start_file, sampler, "cpu",
                               variants.resolve(variants.Variant(), config), shared_prompts=shared)
        record, rows, timings = core.run_iteration(loop, 0, sampler)
        # the reference forward alone, on the same batch, to split "optimisation" into its parts
        prompts = [loop.prompts[r["problem_id"]] for r in rows]
        responses = [r["response_ids"] for r in rows]
        batch = scoring.make_batch(prompts, responses, loop.tokenizer.pad_token_id)
        scorer = (core.shared_prompt_scorer(prompts, responses, loop.G, loop.tokenizer.pad_token_id) if shared
                  else core.plain_scorer(batch))
        start = time.perf_counter()
        core.reference_scores(loop.reference, batch, scorer)
        reference_s = time.perf_counter() - start
        parts = {"generation": timings["generation"], "reference": reference_s,
                 "updates": timings["optimisation"] - reference_s, "check": timings["logprob_check"]}
        parts["bookkeeping"] = timings["iteration_total"] - sum(parts.values())
        generated = sum(len(r) for r in responses)
        scored = sum(len(p) + len(r) for p, r in zip(prompts, responses))
        print(f"\n[4] one iteration, {name}: {timings['iteration_total']:.3f} s")
        for part, s in parts.items():
            rate = {"generation": f"{generated / s:8.0f} generated tokens/s",
                    "updates": f"{scored * loop.resolved.updates_per_iteration / s:8.0f} scored tokens/s"}.get(part, "")
            print(f"    {part:<12} {s:7.3f} s  {rate}")
        out[name] = {"total": timings["iteration_total"], **parts}
    protocol, fast, static = out.values()
    print(f"    the fast set-up's iteration is {protocol['total'] / fast['total']:.2f}x the protocol's, "
          f"the static one's {protocol['total'] / static['total']:.2f}x (`grpo --sampler static --scoring shared`)")
    return out


def bench_worked(repeats: int) -> dict | None:
    """Section 5: worked answers (40 tokens and more) from the skill base: the samplers, the floor, one iteration."""
    from ..studies import reasoning, thinking_base
    from ..task import worked

    from ..studies import rarer_bases

    # the thinking step's skill base (kept local: `cache fill`), else the rarer bases' own, made by the same recipe
    skill = next((path for path in (thinking_base.default_run_dir("tiny", "skill") / thinking_base.MODEL_FILE,
                                    rarer_bases.base_dir("tiny", "skill") / thinking_base.MODEL_FILE) if path.is_file()),
                 None)
    if skill is None:
        print("\n[5] worked answers: skipped, the skill base's model is not here (`python -m labkit cache fill "
              "--steps thinking --runs skill`, or `python -m labkit rarer-bases`, which builds one of its own)")
        return None
    cfg = ReasoningConfig()
    loop = reasoning.new_loop(reasoning.ReasoningRun("bench", "rare_2"), cfg, skill)
    model, tokenizer, G = loop.model, loop.tokenizer, loop.G
    chosen, seeds = core.draw_prompts(loop)
    rows = [loop.prompts[p["id"]] for p in chosen for _ in range(G)]
    limit = worked.WORKED_MAX_NEW_TOKENS
    common = dict(max_new_tokens=limit, policy_digest=presets.parameter_digest(model))
    methods = {"fast": lambda: sampling.sample_fast(model, tokenizer, rows, seeds, **common),
               "static": lambda: sample_static(model, tokenizer, rows, seeds, **common),
               "generate()": lambda: generate_rows(model, tokenizer, rows, False, limit)}
    for fn in methods.values():
        fn()
    seconds, results = best_of(methods, repeats)
    tokens = sum(len(r.response_ids) for r in results["fast"])
    context = sum(map(len, rows)) // len(rows) + tokens // len(rows)
    macs = multiply_adds_per_token(model, context)
    print(f"\n[5] worked answers from the skill base: {len(rows)} rollouts, {tokens} tokens "
          f"({tokens / len(rows):.0f} a response, {sum(len(r.response_ids) >= 40 for r in results['fast'])} of "
          f"{len(rows)} at 40 or more)")
    for name, s in seconds.items():
        print(f"    {name:<11} {s:8.3f} s   {tokens / s:8.0f} tokens/s")
    print(f"    static is {seconds['generate()'] / seconds['static']:.2f}x generate(), "
          f"{seconds['fast'] / seconds['static']:.2f}x the fast sampler; "
          f"{sum(f.response_ids == t.response_ids for f, t in zip(results['fast'], results['static']))}/{len(rows)} "
          "rollouts token-identical to the fast sampler's")
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    start = time.perf_counter()
    a @ b
    peak = 2 * 1024 ** 3 / (time.perf_counter() - start)
    floor = 2 * macs * tokens / peak
    print(f"    the floor: {2 * macs / 1e6:.2f} MFLOP a token at a {context}-token context; the arithmetic of "
          f"these tokens at this machine's matmul rate takes {floor * 1e3:.1f} ms, the static sampler "
          f"{seconds['static'] / floor:.0f}x that")
    iteration = bench_worked_iteration(loop, repeats, peak)
    return {"seconds": seconds, "tokens": tokens, "floor_s": floor, **iteration}


# The update of a worked iteration, stage by stage (`bench_worked_iteration`).  "today" is the path every
# reasoning run took up to December 2026 (each row its full prompt, every response padded to the batch's
# longest); "bucketed" is today's (each prompt once, responses in buckets of similar length).
UPDATE_PATHS = {"today": dict(shared_prompts=False, bucket_tokens=None),
                "bucketed": dict(shared_prompts=True, bucket_tokens=shared_prompt.BUCKET_TOKENS)}


def _update_stages(loop, sampled) -> tuple[dict, list[dict], list[torch.Tensor]]:
    """({stage: seconds}, the updates' metrics, the first update's gradients): `core.update_iteration`'s
    work on `sampled`, one stage at a time, with the loop's scoring path (the same calls, in its order)."""
    from ..train.schedule import warmup_linear_decay

    config, resolved, model = loop.config, loop.resolved, loop.model
    times = dict.fromkeys(("batch", "reference forward", "policy forward", "loss", "backward", "step"), 0.0)
    t = time.perf_counter()
    rows = core.learning_rows(loop, sampled)
    times["batch"] += time.perf_counter() - t
    t = time.perf_counter()
    ref_scores = core.reference_scores(loop.reference, rows.batch, rows.scorer)
    times["reference forward"] += time.perf_counter() - t
    metrics, gradients = [], []
    for k in range(resolved.updates_per_iteration):
        lr = warmup_linear_decay(loop.next_update, loop.total_updates, config.grpo_lr, config.warmup_fraction,
                                 config.final_lr_fraction)
        loop.optimizer.zero_grad(set_to_none=True)
        t = time.perf_counter()
        logp_cur, logits_cur = rows.scorer(model)
        times["policy forward"] += time.perf_counter() - t
        t = time.perf_counter()
        loss, m = core.grpo_loss(variants.LossBatch(
            logp=logp_cur, logits=logits_cur, logp_ref=ref_scores[0], logits_ref=ref_scores[1], mask=rows.loss_mask,
            measure_mask=rows.batch.response_mask, G=rows.G, logp_old=rows.logp_old, advantages=rows.advantages),
            resolved)
        times["loss"] += time.perf_counter() - t
        t = time.perf_counter()
        loss.backward()
        times["backward"] += time.perf_counter() - t
        if k == 0:
            gradients = [p.grad.detach().clone() for p in model.parameters()]
        t = time.perf_counter()
        for group in loop.optimizer.param_groups:
            group["lr"] = lr
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), config.grad_clip)
        loop.optimizer.step()
        times["step"] += time.perf_counter() - t
        loop.next_update += 1
        metrics.append(m)
    return times, metrics, gradients


def bench_worked_iteration(loop, repeats: int, peak_flops: float) -> dict:
    """One worked iteration from the skill base: sampled once (the static sampler), then its update by each
    path in `UPDATE_PATHS` from the same weights and optimiser state (restored between them), stage by stage;
    the updates' losses and first gradients compared; both against the arithmetic floor of the tokens the
    batch holds (each prompt once, each response token once: forward + 2 x backward per update, one
    reference forward), at this machine's matmul rate."""
    import copy

    from ..studies import reasoning

    from ..models import static_sampler

    # sampling: today's decoder kept every row to the end; now finished rows leave it (`COMPACT_BELOW`)
    saved_order = (loop.order.state(), loop.generation.get_state())
    sampling_s, drawn = {}, {}
    for i in range(repeats):
        for name, compact in ((("today", 2.0), ("now", static_sampler.COMPACT_BELOW)) if i % 2 == 0 else
                              (("now", static_sampler.COMPACT_BELOW), ("today", 2.0))):
            loop.order.restore(saved_order[0])
            loop.generation.set_state(saved_order[1])
            kept, static_sampler.COMPACT_BELOW = static_sampler.COMPACT_BELOW, compact
            try:
                t = time.perf_counter()
                drawn[name] = reasoning.sample_iteration(loop, 0)
                sampling_s[name] = min(sampling_s.get(name, float("inf")), time.perf_counter() - t)
            finally:
                static_sampler.COMPACT_BELOW = kept
    sampled = drawn["now"]
    same = [r.response_ids for r in drawn["today"].rollouts] == [r.response_ids for r in sampled.rollouts]
    saved = (copy.deepcopy(loop.model.state_dict()), copy.deepcopy(loop.optimizer.state_dict()), loop.next_update)
    results = {}
    for i in range(repeats):
        for name, options in (list(UPDATE_PATHS.items()) if i % 2 == 0 else list(UPDATE_PATHS.items())[::-1]):
            loop.model.load_state_dict(saved[0])
            loop.optimizer.load_state_dict(saved[1])
            loop.next_update, loop.shared_prompts, loop.bucket_tokens = saved[2], options["shared_prompts"], \
                options["bucket_tokens"]
            times, metrics, gradients = _update_stages(loop, sampled)
            if name not in results or sum(times.values()) < sum(results[name][0].values()):
                results[name] = (times, metrics, gradients)
    loop.model.load_state_dict(saved[0])
    loop.optimizer.load_state_dict(saved[1])
    rollouts_ = sampled.rollouts
    responses = sum(len(r.response_ids) for r in rollouts_)
    prompt_tokens = sum(len(p) for p in {tuple(r.prompt_ids) for r in rollouts_})
    context = prompt_tokens // len({tuple(r.prompt_ids) for r in rollouts_}) + responses // (2 * len(rollouts_))
    updates = loop.resolved.updates_per_iteration
    flops = 2 * multiply_adds_per_token(loop.model, context) * (prompt_tokens + responses) * (1 + 3 * updates)
    floor = flops / peak_flops
    print(f"    one worked iteration ({len(rollouts_)} responses, {responses} tokens): sampling today "
          f"{sampling_s['today']:.2f} s, now {sampling_s['now']:.2f} s (finished rows leave the decoder; the same "
          f"tokens: {same}); its {updates} updates from the same state by each path (best of {repeats}):")
    out = {"sampling_s": sampling_s, "same_rollouts": same, "floor_update_s": floor}
    for name, (times, _, _) in results.items():
        total = sum(times.values())
        stages = ", ".join(f"{stage} {s:.2f}" for stage, s in times.items())
        print(f"    {name:<9} update {total:6.2f} s = {stages}; {total / floor:.1f}x its floor; "
              f"{1e6 * total / responses:.0f} us a response token")
        sampling = sampling_s["today" if name == "today" else "now"]
        out[name] = {"update_s": total, "iteration_s": sampling + total, "stages": times}
    (_, today_metrics, today_grads), (_, new_metrics, new_grads) = results["today"], results["bucketed"]
    loss_diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(today_metrics, new_metrics))
    grad_diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(today_grads, new_grads))
    ratio = out["today"]["iteration_s"] / out["bucketed"]["iteration_s"]
    print(f"    the floor: {floor:.2f} s for {prompt_tokens} prompt + {responses} response tokens at "
          f"{peak_flops / 1e9:.0f} GFLOP/s; the two paths' losses differ by at most {loss_diff:.1e}, the first "
          f"update's gradients by {grad_diff:.1e} of each tensor's largest entry")
    print(f"    a worked iteration: today {out['today']['iteration_s']:.2f} s, now (a decoder that drops its finished "
          f"rows, bucketed scoring) {out['bucketed']['iteration_s']:.2f} s: {ratio:.2f}x, at "
          f"{torch.get_num_threads()} thread(s)")
    out.update(ratio=ratio, loss_diff=loss_diff, grad_diff=grad_diff)
    out["threads"] = _worked_at_threads(loop, repeats, saved, saved_order, drawn["now"], new_metrics, out)
    return out


def _worked_at_threads(loop, repeats: int, saved, saved_order, sampled_one, metrics_one, out: dict) -> dict | None:
    """Today's path again at two torch threads where this machine has two cores or more (a student's laptop
    does): the same iteration sampled and updated from the same state, best of `repeats`; its rollouts checked
    against one thread's and its losses compared.  None (and a line saying so) on a one-core machine."""
    import os

    from ..studies import reasoning

    threads, kept = min(2, os.cpu_count() or 1), torch.get_num_threads()
    if threads < 2:
        print("    two threads: skipped, this machine has one core")
        return None
    torch.set_num_threads(threads)
    try:
        best, same, loss_diff = None, True, 0.0
        for _ in range(repeats):
            loop.order.restore(saved_order[0])
            loop.generation.set_state(saved_order[1])
            t = time.perf_counter()
            sampled = reasoning.sample_iteration(loop, 0)
            sampling = time.perf_counter() - t
            same &= [r.response_ids for r in sampled.rollouts] == [r.response_ids for r in sampled_one.rollouts]
            loop.model.load_state_dict(saved[0])
            loop.optimizer.load_state_dict(saved[1])
            loop.next_update, loop.shared_prompts, loop.bucket_tokens = saved[2], True, \
                UPDATE_PATHS["bucketed"]["bucket_tokens"]
            times, metrics, _ = _update_stages(loop, sampled)
            loss_diff = max(loss_diff, *(abs(a["loss"] - b["loss"]) for a, b in zip(metrics, metrics_one)))
            total = sampling + sum(times.values())
            best = total if best is None else min(best, total)
    finally:
        torch.set_num_threads(kept)
        loop.model.load_state_dict(saved[0])
        loop.optimizer.load_state_dict(saved[1])
        loop.next_update = saved[2]
    ratio = out["today"]["iteration_s"] / best
    print(f"    at {threads} threads, as on a two-core laptop: {best:.2f} s an iteration, {ratio:.2f}x today's one-thread "
          f"iteration (the same rollouts: {same}; losses within {loss_diff:.1e} of one thread's)")
    return {"threads": threads, "iteration_s": best, "ratio": ratio, "same_rollouts": same, "loss_diff": loss_diff}


def run(argv: list[str] | None = None) -> dict:
    """Parse the options, run the four sections (printing as they go) and return their figures."""
    parser = argparse.ArgumentParser(prog="python -m labkit bench grpo", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default: %(default)s; 0 keeps torch's own setting)")
    parser.add_argument("--repeats", type=int, default=3, help="timings keep the best of this many (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=scoring.MAX_NEW_TOKENS,
                        help="response limit (default: %(default)s, the protocol's)")
    parser.add_argument("--quick", action="store_true",
                        help="the smoke test's size: 8 new tokens, one repeat, G=4 only")
    args = parser.parse_args(argv)
    if args.threads < 0 or args.repeats < 1:
        parser.error(f"--threads {args.threads} / --repeats {args.repeats}: threads >= 0, repeats >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    max_new_tokens, repeats = (8, 1) if args.quick else (args.max_new_tokens, args.repeats)
    model, tokenizer, description = load_model()
    print(f"model: {description}; {torch.get_num_threads()} torch thread(s); at most {max_new_tokens} new tokens; "
          f"best of {repeats}")
    report = {"sampling": bench_sampling(model, tokenizer, max_new_tokens, repeats),
              "floor": bench_floor(model, repeats),
              "updates": bench_updates(model, tokenizer, (4,) if args.quick else (4, 8), max_new_tokens, repeats)}
    start_file = WARM_START if WARM_START.is_file() else presets.TINY_BASE_STATE
    report["iteration"] = bench_iteration(max_new_tokens, start_file)
    report["worked"] = None if args.quick else bench_worked(repeats)
    return report


def main(argv: list[str] | None = None) -> int:
    run(argv)
    return 0
