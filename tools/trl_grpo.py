"""TRL's GRPOTrainer against the lab's loop on the protocol's iteration, back to back in one process.

Issue 55 asks that the lab's GRPO iteration (4 prompts x G = 4, at most 64 new tokens, two updates on
the same rollouts, beta 0.02, clip 0.2) be at least 4x TRL's at the same settings on the same machine.
TRL is never a dependency of the lab: this script runs in a scratch environment of its own,

    python -m venv /tmp/trl
    /tmp/trl/bin/pip install torch==2.13.0 'trl==1.16.*' transformers==<the lab's, from requirements.txt>
    PYTHONPATH=. /tmp/trl/bin/python tools/trl_grpo.py [--iterations 6] [--rounds 2] [--threads 1] [--worked]

and prints, for each set-up, the seconds of each rollout set (sampling + both updates) after the first
(warm-up) one, and their median.  Both start from the committed tiny warm start, with the prompts the lab's
loop draws, in its order (`lab_order`), and the protocol's verifier as the reward.  The set-ups alternate
over `--rounds`, so that a change in the machine's load hits them alike; nothing here is asserted.

What is the same: the model, the prompts' token ids (TRL applies the same chat template), P x G, the
response limit, temperature 1 with the full distribution (top_k 0, top_p 1), two optimiser steps per
rollout set (TRL's num_iterations = 2), beta, epsilon, AdamW's rate, weight decay and grad clip, fp32,
one torch thread.  What differs by design: TRL samples with transformers' `generate()` and recomputes
the old log-probs with a forward of its own (num_iterations > 1), where the lab records them at sampling.

--worked: chapter 11's iteration instead (16 worked prompts x G = 8, at most 160 new tokens, its rate), from
the thinking step's skill base (local: `python -m labkit cache fill --steps thinking --runs skill`), rewarded
by `worked.score_worked`; the lab's set-up is chapter 11's own (`reasoning.new_loop`: the static sampler,
bucketed shared-prompt scoring).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def lab_worked_iterations(iterations: int) -> list[float]:
    """Seconds of each of `iterations` iterations of chapter 11's loop from the skill base, in memory."""
    from labkit.config import ReasoningConfig
    from labkit.grpo import core
    from labkit.studies import reasoning

    loop = reasoning.new_loop(reasoning.get_run("from_rare_2"), ReasoningConfig(), skill_base())
    seconds = []
    for i in range(iterations):
        t = time.perf_counter()
        core.run_iteration(loop, i, reasoning.SAMPLER)
        seconds.append(time.perf_counter() - t)
    return seconds


def skill_base():
    """The thinking step's skill base (a local file), or an exit naming the command that rebuilds it."""
    from labkit.studies import thinking_base

    path = thinking_base.default_run_dir("tiny", "skill") / thinking_base.MODEL_FILE
    if not path.is_file():
        raise SystemExit(f"--worked: {path} is not here; `python -m labkit cache fill --steps thinking --runs skill`")
    return path


def lab_iterations(iterations: int, sampler: str, shared: bool) -> list[float]:
    """Seconds of each of `iterations` iterations of the lab's loop (`core.run_iteration`), in memory."""
    from labkit.config import TINY
    from labkit.grpo import core, variants
    from labkit.grpo.loop import start_loop
    from labkit.models import presets

    start_file = presets.REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"
    loop = start_loop(TINY, TINY.G, iterations, start_file, sampler, "cpu",
                      variants.resolve(variants.Variant(), TINY), shared_prompts=shared)
    seconds = []
    for i in range(iterations):
        t = time.perf_counter()
        core.run_iteration(loop, i, sampler)
        seconds.append(time.perf_counter() - t)
    return seconds


def lab_order(loop, iterations: int) -> list[dict]:
    """The prompts the lab's loop draws in its first `iterations` iterations, in order (TRL gets the same ones:
    chapter 11's pool is ordered by chain length, so its first prompts would be its shortest)."""
    from labkit.grpo import core

    return [p for _ in range(iterations) for p in core.draw_prompts(loop)[0]]


def trl_iterations(iterations: int, worked_task: bool = False) -> list[float]:
    """Seconds of each of `iterations` rollout sets of TRL's GRPOTrainer (generation + two steps); worked_task:
    chapter 11's prompts, budget and verifier from the skill base."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from labkit.config import TINY
    from labkit.grpo import variants
    from labkit.grpo.loop import start_loop
    from labkit.models import presets
    from labkit.task import verifier
    from labkit.task.problems import FORMAT_INSTRUCTION

    config = TINY
    if worked_task:
        from labkit.config import ReasoningConfig
        from labkit.eval import think_profile
        from labkit.studies import reasoning
        from labkit.task import worked

        config = reasoning.preset_config(ReasoningConfig())
        model, tokenizer = presets.load("tiny", state=skill_base(), device="cpu")
        chains = lab_order(reasoning.new_loop(reasoning.get_run("from_rare_2"), ReasoningConfig(), skill_base()),
                           iterations)
        problems = {c["problem"].statement(think_profile.ITEM) + "\n" + worked.WORKED_INSTRUCTION: c["problem"]
                    for c in chains}  # the text of `think_profile.worked_prompt_ids`'s user turn
        outcome = reasoning.REWARDS["outcome"]

        def reward_of(text, finish, chain):
            return outcome(worked.score_worked(text, finish, chain), chain)
        G = ReasoningConfig().G
    else:
        start_file = presets.REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"
        model, tokenizer = presets.load("tiny", state=start_file, device="cpu")
        pool = lab_order(start_loop(TINY, TINY.G, iterations, start_file, "static", "cpu",
                                    variants.resolve(variants.Variant(), TINY)), iterations)
        problems = {r["statement"] + "\n" + FORMAT_INSTRUCTION: r["problem"] for r in pool}

        def reward_of(text, finish, problem):
            return verifier.score(text, finish, problem).reward
        G = config.G
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text in problems])

    def reward(prompts, completions, completion_ids, **_):
        finish = ["length" if len(ids) >= config.max_new_tokens else "eos" for ids in completion_ids]
        return [float(reward_of(c[0]["content"], f, problems[p[0]["content"]])) for p, c, f in zip(prompts, completions, finish)]

    stamps = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        # TRL loads the frozen reference from a path: the warm start, saved as transformers saves a model.
        # The lab scores in eval mode; TRL trains in train mode, and its disable_dropout reaches nn.Dropout
        # modules only, not Qwen2's attention dropout (a float of the config, 0.1 in the tiny preset)
        model.config.attention_dropout = 0.0
        model.save_pretrained(f"{out}/warm_start")
        tokenizer.save_pretrained(f"{out}/warm_start")
        trl_config = GRPOConfig(
            model_init_kwargs={"attn_implementation": "eager", "dtype": torch.float32},
            output_dir=out, use_cpu=True, report_to=[], save_strategy="no", logging_steps=10**6,
            per_device_train_batch_size=config.prompts_per_iteration * G, num_generations=G,
            gradient_accumulation_steps=1, num_iterations=config.updates_per_iteration,
            max_steps=iterations * config.updates_per_iteration, max_completion_length=config.max_new_tokens,
            temperature=1.0, top_k=0, top_p=1.0, beta=config.kl_coef, epsilon=config.clip_eps, loss_type="grpo",
            learning_rate=config.grpo_lr, weight_decay=config.grpo_weight_decay, max_grad_norm=config.grad_clip,
            lr_scheduler_type="linear", warmup_steps=config.warmup_fraction, shuffle_dataset=False,
            dataloader_num_workers=0, disable_tqdm=True, disable_dropout=True, seed=config.seed)
        trainer = GRPOTrainer(model=f"{out}/warm_start", reward_funcs=reward, args=trl_config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Clock()])
        began = time.perf_counter()
        trainer.train()
    ends = [began] + stamps[config.updates_per_iteration - 1:: config.updates_per_iteration]
    return [b - a for a, b in zip(ends, ends[1:])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=6, help="rollout sets per set-up and round (default: 6)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all set-ups, alternating (default: 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--worked", action="store_true",
                        help="chapter 11's worked-answer iteration from the skill base instead of the protocol's")
    args = parser.parse_args()
    if args.iterations < 2 or args.rounds < 1 or args.threads < 1:
        parser.error("--iterations >= 2 (the first is warm-up), --rounds >= 1, --threads >= 1")
    import torch
    import transformers
    import trl

    torch.set_num_threads(args.threads)
    setups = ({"TRL GRPOTrainer": lambda: trl_iterations(args.iterations, worked_task=True),
               "lab, chapter 11's loop": lambda: lab_worked_iterations(args.iterations)} if args.worked else
              {"TRL GRPOTrainer": lambda: trl_iterations(args.iterations),
               "lab, default (reference sampler, plain scoring)": lambda: lab_iterations(args.iterations, "reference",
                                                                                         False),
               "lab, static sampler, shared scoring": lambda: lab_iterations(args.iterations, "static", True)})
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
          f"{torch.get_num_threads()} thread(s); {args.iterations} rollout sets a round (the first is warm-up)")
    seen = {name: [] for name in setups}
    for r in range(args.rounds):
        for name, fn in (list(setups.items()) if r % 2 == 0 else list(setups.items())[::-1]):
            seconds = fn()[1:]
            seen[name] += seconds
            print(f"round {r + 1}  {name:<48} " + " ".join(f"{s:.3f}" for s in seconds))
    medians = {name: statistics.median(s) for name, s in seen.items()}
    trl_s = medians["TRL GRPOTrainer"]
    for name, s in medians.items():
        print(f"median  {name:<48} {s:.3f} s a rollout set   TRL / this = {trl_s / s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
