"""The step graph of the cached tiny run: each step's folder, the functions that build it, its other
inputs and the steps it is built from.

A step's code is named by its entry points, the library functions its command calls
(`python -m labkit grpo` calls `labkit.grpo.loop.run_grpo`, its resume check `resume_check`); what
they reach is fingerprinted by `labkit.lab.fingerprint`, and `labkit.lab.cache` records and checks it.
The graph sits here, above every unit it names, so that nothing below the commands knows of the
modules above it.
"""

from __future__ import annotations

from .lab.cache import CacheStep

DATA_FILES = tuple(
    f"data/stock_arithmetic_v1/{split}.{kind}.jsonl"
    for split in ("train", "validation", "test")
    for kind in ("statements", "labels")
)
TOKENIZER = "labkit/assets/tiny/tokenizer.json"

# The base's fingerprint leaves these modules out: nearly every change to the lab edits one of them, and
# counting them would make each such change re-pretrain the base (2.5 hours on one thread).  What they
# give pretraining is checked instead, by tests/test_cache_steps.py.
BASE_UNRECORDED = ("labkit.config", "labkit.models.presets", "labkit.lab.runs", "labkit.lab.state",
                   "labkit.models.tokenizer")
BASE_UNRECORDED_WHY = (
    "Their versions of 2026-12-01 re-pretrained the base bit for bit (same model.safetensors), and so did the "
    "re-layout's (2026-12-04, commit 4e9dc8a: every file moved into its sub-package; 8,434 s on one thread, "
    "SHA-256 5946893370...).  What pretraining takes from config.py and "
    "models/presets.py is the architecture, its initialisation and the two phases' settings (PretrainConfig, "
    "AnswerPhaseConfig, CORPUS_SEED), and tests check that presets.tiny_model_config() still equals the "
    "committed base's config.json and PretrainConfig() its manifest's config; lab/runs.py and lab/state.py "
    "check, list and write files; models/tokenizer.py loads the recorded tokenizer asset, which is a recorded "
    "input.")

# The thinking bases' fingerprint leaves the run folders' plumbing out too: a change to how a folder is locked,
# listed or written (the lock across threads of 2026-12-06), or to when a state is saved and how Ctrl-C stops a
# base, would otherwise rebuild the five bases (43 minutes on two workers) for files that come out the same.
THINKING_UNRECORDED = ("labkit.lab.runs", "labkit.lab.skeleton", "labkit.lab.state")
THINKING_UNRECORDED_WHY = (
    "lab/runs.py decides whether and where a step writes (the folder's lock, its ledger, atomic writes) and checks "
    "what it reads against recorded digests; lab/skeleton.py decides when a state is saved and how a Ctrl-C stops "
    "a run; lab/state.py writes and reads those states.  No number a base computes passes through them: a base "
    "stopped and resumed from a state is the uninterrupted one bit for bit (tests/test_thinking_base_resume.py), "
    "and every base model is checked against its manifest's SHA-256 when it is loaded (`cache fill` rebuilds one "
    "and keeps it only if it is that file).  labkit.lab.runs was left out on 2026-12-06, when `cache check` named "
    "only its lock definitions as changed for this step; the skeleton and the states the same day, when the bases "
    "came on the run skeleton (issue 58).")

STEPS = (
    CacheStep("base", "base", ("labkit.train.pretrain:pretrain",), (TOKENIZER,), unrecorded=BASE_UNRECORDED),
    # the samplers are compared on the warm start (sampler_agreement.json)
    CacheStep("warm_start", "warm_start",
         ("labkit.train.sft:run_branch", "labkit.train.sft:resume_check", "labkit.eval.agreement:run"),
         DATA_FILES, ("base/model.safetensors",), outputs=("sampler_agreement.json",)),
    CacheStep("sft", "sft", ("labkit.train.sft:run_branch", "labkit.train.sft:resume_check"), DATA_FILES,
         ("warm_start/model.safetensors",)),
    CacheStep("grpo", "grpo", ("labkit.grpo.loop:run_grpo", "labkit.grpo.loop:resume_check"), DATA_FILES,
         ("warm_start/model.safetensors",)),
    CacheStep("evaluation", "evaluation", ("labkit.eval.evaluate:run_evaluations", "labkit.eval.evaluate:write_results"),
         DATA_FILES, ("warm_start/model.safetensors", "sft/model.safetensors", "grpo/model.safetensors"),
         done_file="results.json",  # one FINISHED per policy; results.json is written when all are
         then=("group_size",)),  # the exercise adds its two branches' evaluations here
    CacheStep("group_size", "group_size", ("labkit.studies.group_size:run_exercise",), DATA_FILES,
         ("warm_start/model.safetensors",), outputs=("grpo_g2", "grpo_g8")),
    CacheStep("reward_model", "reward_model", ("labkit.studies.reward_model:run_reward_model",), (),
         ("warm_start/model.safetensors", "sft/model.safetensors")),
    # the format base leaves the run folders' plumbing out as the thinking bases do, for the same reasons (its
    # exact resume: tests/test_format_base.py); since 2026-12-06, when it came on the run skeleton (issue 58)
    CacheStep("format_base", "format_base", ("labkit.studies.format_base:run_format_base",), (*DATA_FILES, TOKENIZER),
         ("base/model.safetensors",), unrecorded=THINKING_UNRECORDED),
    # chapters 6-7's larger run: trained, evaluated, and 64 draws of it and of the warm start for pass@k
    CacheStep("grpo_large", "grpo_large", ("labkit.studies.larger_run:train", "labkit.studies.larger_run:evaluate_all"),
         DATA_FILES, ("warm_start/model.safetensors",), done_file="pass_at_k/grpo_large/FINISHED"),
    # chapter 10's over-optimisation: proxies of several strengths, best-of-n, GRPO against them
    CacheStep("overoptimisation", "overoptimisation", ("labkit.studies.overoptimisation:run_all",), DATA_FILES,
         ("warm_start/model.safetensors", "base/model.safetensors", "reward_model/model.safetensors",
          "reward_model/samples.jsonl.gz"), done_file="manifest.json"),
    # chapters 2-3: the policy-gradient identity and the gradient's noise at the warm start
    CacheStep("gradient_study", "gradient_study", ("labkit.studies.gradient_study:run_study",), DATA_FILES,
         ("warm_start/model.safetensors",)),
    # chapter 11: bases that can work a problem out and rarely do, then GRPO on worked answers from each
    CacheStep("thinking", "thinking", ("labkit.studies.thinking_base:run_all",), (TOKENIZER,),
         ("base/model.safetensors",), done_file="manifest.json", unrecorded=THINKING_UNRECORDED),
    CacheStep("reasoning", "reasoning", ("labkit.studies.reasoning:run_all",), (TOKENIZER,),
         tuple(f"thinking/{name}/manifest.json" for name in ("rare_0", "rare_2", "rare_10", "control")),
         done_file="manifest.json"),
    # chapter 11: skill or propensity, the working started for each base
    CacheStep("skill_test", "skill_test", ("labkit.studies.skill_test:run",), (TOKENIZER,),
         tuple(f"thinking/{name}/manifest.json" for name in ("skill", "rare_0", "rare_2", "control"))),
    # chapter 11: pass@k up to k = 256 of the bases and of the runs from them (their models: `cache fill`)
    CacheStep("crossover", "crossover", ("labkit.studies.crossover:run",), (TOKENIZER,),
         tuple(f"thinking/{name}/manifest.json" for name in ("skill", "rare_2", "rare_10"))
         + tuple(f"reasoning/{name}/manifest.json" for name in ("from_rare_2", "from_rare_10"))),
    # chapter 11: bases rarer than rare_2, on a lineage of their own (a skill base rebuilt in the step), and GRPO
    # from each
    CacheStep("rarer", "rarer", ("labkit.studies.rarer_bases:run_all",), (TOKENIZER,), ("base/model.safetensors",),
              done_file="manifest.json"),
)
STEP_NAMES = tuple(s.name for s in STEPS)


def get_step(name: str) -> CacheStep:
    for s in STEPS:
        if s.name == name:
            return s
    raise ValueError(f"unknown step {name!r}; expected one of {STEP_NAMES}")
