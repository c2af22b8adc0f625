"""The cached tiny run: what made each step, and whether it is stale.

The notebooks and CI read the committed tiny run under `runs/tiny/`.  Each
step of it was made by some code, some data and the outputs of earlier steps.
`runs/<preset>/cache.json` records, for every step, the SHA-256 of each of
those inputs at the time the step was built.  `check` recomputes them: a step is
stale when any input changed since, and the message names the inputs.  Inputs
include upstream artifacts (e.g. the warm start's model file for GRPO), so a
rebuilt step makes everything downstream of it stale too.

`python -m labkit cache check` prints the verdicts; `make cache` rebuilds the
stale steps (`python -m labkit all --preset tiny --rebuild-stale`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .runs import REPO_ROOT, is_finished, preset_folder, read_json, sha256_file, write_json

DATA_FILES = tuple(
    f"data/stock_arithmetic_v1/{split}.{kind}.jsonl"
    for split in ("train", "validation", "test")
    for kind in ("statements", "labels")
)
# Every labkit module a step's code imports, directly or not, is an input of the step
# (tests/test_cache_steps.py checks it), so that no change to the code that made a step goes unseen.  The
# packages' __init__.py files are not: each holds its docstring and nothing else (tests/test_layers.py), and
# labkit/__init__.py its docstring and __version__, so importing them runs nothing a step computes with.
LEARNING_CODE = ("labkit/config.py", "labkit/lab/memory.py", "labkit/lab/resume.py", "labkit/lab/runs.py",
                 "labkit/lab/runtime.py", "labkit/lab/skeleton.py", "labkit/lab/state.py", "labkit/task/data.py", "labkit/task/problems.py",
                 "labkit/task/verifier.py", "labkit/models/presets.py", "labkit/models/rollouts.py",
                 "labkit/models/sampling.py", "labkit/models/scoring.py", "labkit/models/static_sampler.py",
                 "labkit/models/tokenizer.py", "labkit/train/schedule.py")
ROLLOUT_CODE = ("labkit/models/shared_prompt.py", "labkit/grpo/checkpoint_curves.py", "labkit/grpo/core.py",
                "labkit/grpo/loop.py", "labkit/grpo/losses.py", "labkit/grpo/metrics.py", "labkit/grpo/objectives.py",
                "labkit/grpo/variants.py", "labkit/eval/evaluate.py",
                "labkit/studies/reward_model.py")  # reward_model finds its policies with evaluate
# The base's imports that it does not record, because nearly every change to the lab edits one of them and
# recording them would make each such change re-pretrain the base (100 minutes on one thread).  What they
# give pretraining is checked instead (see BASE_UNRECORDED_WHY and tests/test_cache_steps.py).
BASE_UNRECORDED = ("labkit/config.py", "labkit/models/presets.py", "labkit/lab/runs.py", "labkit/lab/state.py", "labkit/models/tokenizer.py")
BASE_UNRECORDED_WHY = (
    "Their versions of 2026-12-01 re-pretrained the base bit for bit (same model.safetensors), and so did the "
    "re-layout's (2026-12-04, commit 4e9dc8a: every file moved into its sub-package; 8,434 s on one thread, "
    "SHA-256 5946893370...).  What pretraining takes from config.py and "
    "models/presets.py is the architecture, its initialisation and the two phases' settings (PretrainConfig, "
    "AnswerPhaseConfig, CORPUS_SEED), and tests check that presets.tiny_model_config() still equals the "
    "committed base's config.json and PretrainConfig() its manifest's config; lab/runs.py and lab/state.py "
    "check, list and write files; models/tokenizer.py loads the recorded tokenizer asset, which is a recorded "
    "input.")


@dataclass(frozen=True)
class Step:
    """One step of the protocol: its folder under runs/<preset>/ and the inputs that made it."""

    name: str
    folder: str
    code: tuple[str, ...]
    upstream: tuple[str, ...] = ()  # files of earlier steps, relative to runs/<preset>/
    done_file: str | None = None  # the file that says the step is built (default: the folder's FINISHED marker)
    outputs: tuple[str, ...] = ()  # other files or folders of runs/<preset>/ the step writes (rebuilt with it)
    then: tuple[str, ...] = ()  # later steps that write into this step's output, so are rebuilt with it

    def is_built(self, preset: str) -> bool:
        folder = runs_dir(preset) / self.folder
        return (folder / self.done_file).is_file() if self.done_file else is_finished(folder)


STEPS = (
    Step("base", "base", ("labkit/task/problems.py", "labkit/train/corpus.py", "labkit/train/pretrain.py", "labkit/train/answer_phase.py",
                          "labkit/train/schedule.py", "labkit/assets/tiny/tokenizer.json")),
    Step("warm_start", "warm_start", (*LEARNING_CODE, "labkit/train/sft.py", "labkit/eval/agreement.py", "labkit/eval/evaluate.py",
                                      "labkit/grpo/metrics.py", *DATA_FILES),
         ("base/model.safetensors",),
         outputs=("sampler_agreement.json",)),  # the samplers are compared on the warm start
    Step("sft", "sft", (*LEARNING_CODE, "labkit/train/sft.py", *DATA_FILES), ("warm_start/model.safetensors",)),
    Step("grpo", "grpo", (*LEARNING_CODE, *ROLLOUT_CODE, *DATA_FILES), ("warm_start/model.safetensors",)),
    Step("evaluation", "evaluation", ("labkit/eval/evaluate.py", "labkit/grpo/metrics.py", *LEARNING_CODE, *DATA_FILES),
         ("warm_start/model.safetensors", "sft/model.safetensors", "grpo/model.safetensors"),
         done_file="results.json",  # one FINISHED per policy; results.json is written when all are
         then=("group_size",)),  # the exercise adds its two branches' evaluations here
    Step("group_size", "group_size", (*LEARNING_CODE, *ROLLOUT_CODE, "labkit/studies/group_size.py", *DATA_FILES),
         ("warm_start/model.safetensors",),
         outputs=("grpo_g2", "grpo_g8")),
    Step("reward_model", "reward_model", (*LEARNING_CODE, "labkit/studies/reward_model.py", "labkit/eval/evaluate.py",
                                          "labkit/grpo/metrics.py"),
         ("warm_start/model.safetensors", "sft/model.safetensors")),
    Step("format_base", "format_base", (*LEARNING_CODE, "labkit/studies/format_base.py", "labkit/train/answer_phase.py",
                                        "labkit/train/corpus.py", "labkit/eval/evaluate.py", "labkit/grpo/metrics.py",
                                        "labkit/assets/tiny/tokenizer.json", *DATA_FILES),
         ("base/model.safetensors",)),
    # chapters 6-7's larger run: trained, evaluated, and 64 draws of it and of the warm start for pass@k
    Step("grpo_large", "grpo_large", (*LEARNING_CODE, *ROLLOUT_CODE, "labkit/studies/larger_run.py", *DATA_FILES),
         ("warm_start/model.safetensors",), done_file="pass_at_k/grpo_large/FINISHED"),
    # chapter 10's over-optimisation: proxies of several strengths, best-of-n, GRPO against them
    Step("overoptimisation", "overoptimisation", (*LEARNING_CODE, *ROLLOUT_CODE, "labkit/studies/larger_run.py",
                                                  "labkit/studies/overoptimisation.py", *DATA_FILES),
         ("warm_start/model.safetensors", "base/model.safetensors", "reward_model/model.safetensors",
          "reward_model/samples.jsonl.gz"), done_file="manifest.json"),
    # chapters 2-3: the policy-gradient identity and the gradient's noise at the warm start
    Step("gradient_study", "gradient_study", (*LEARNING_CODE, *ROLLOUT_CODE, "labkit/studies/gradient_study.py", *DATA_FILES),
         ("warm_start/model.safetensors",)),
    # chapter 11: bases that can work a problem out and rarely do, then GRPO on worked answers from each
    Step("thinking", "thinking", (*LEARNING_CODE, "labkit/studies/thinking_base.py", "labkit/task/worked.py",
                                  "labkit/eval/think_profile.py", "labkit/train/answer_phase.py", "labkit/train/corpus.py",
                                  "labkit/train/pretrain.py", "labkit/assets/tiny/tokenizer.json"),
         ("base/model.safetensors",), done_file="manifest.json"),
    Step("reasoning", "reasoning", (*LEARNING_CODE, *ROLLOUT_CODE, "labkit/studies/reasoning.py", "labkit/studies/thinking_base.py",
                                    "labkit/task/worked.py", "labkit/eval/think_profile.py", "labkit/train/answer_phase.py",
                                    "labkit/train/corpus.py", "labkit/train/pretrain.py", "labkit/assets/tiny/tokenizer.json"),
         tuple(f"thinking/{name}/manifest.json" for name in ("rare_0", "rare_2", "rare_10", "control")),
         done_file="manifest.json"),
)
STEP_NAMES = tuple(s.name for s in STEPS)


def get_step(name: str) -> Step:
    for s in STEPS:
        if s.name == name:
            return s
    raise ValueError(f"unknown step {name!r}; expected one of {STEP_NAMES}")


def runs_dir(preset: str) -> Path:
    return preset_folder(preset)


def input_digests(step: Step, preset: str) -> dict[str, str | None]:
    """SHA-256 of every input of `step` now (None for a missing file)."""
    out = {}
    for rel in step.code:
        path = REPO_ROOT / rel
        out[rel] = sha256_file(path) if path.exists() else None
    for rel in step.upstream:
        path = runs_dir(preset) / rel
        out[f"runs/{preset}/{rel}"] = sha256_file(path) if path.exists() else None
    return out


def record(step_name: str, preset: str = "tiny") -> dict:
    """Record the inputs of a freshly built step in runs/<preset>/cache.json."""
    step = get_step(step_name)
    path = runs_dir(preset) / "cache.json"
    cache = read_json(path) if path.exists() else {}
    cache[step.name] = input_digests(step, preset)
    write_json(path, cache)
    return cache[step.name]


def check(preset: str = "tiny", steps: tuple[str, ...] = STEP_NAMES) -> dict[str, dict]:
    """Per step: {"status": "fresh" | "stale" | "missing" | "unrecorded", "changed": [inputs]}."""
    path = runs_dir(preset) / "cache.json"
    cache = read_json(path) if path.exists() else {}
    verdicts = {}
    for name in steps:
        step = get_step(name)
        if not step.is_built(preset):
            verdicts[name] = {"status": "missing", "changed": []}
            continue
        if name not in cache:
            verdicts[name] = {"status": "unrecorded", "changed": []}
            continue
        now = input_digests(step, preset)
        changed = sorted(k for k in set(now) | set(cache[name]) if now.get(k) != cache[name].get(k))
        verdicts[name] = {"status": "stale" if changed else "fresh", "changed": changed}
    return verdicts


def to_rebuild(verdicts: dict[str, dict]) -> list[str]:
    """The stale steps and every step downstream of one (its upstream files or `then`), in STEPS order.

    A rebuilt step changes its output files, so whatever was built from them is stale
    too, even if its own check still says fresh.
    """
    chosen = {name for name, v in verdicts.items() if v["status"] == "stale"}
    grew = True
    while grew:
        grew = False
        folders = {get_step(n).folder for n in chosen}
        for step in STEPS:
            if step.name in chosen:
                continue
            upstream_rebuilt = any(rel.split("/")[0] in folders for rel in step.upstream)
            if upstream_rebuilt or any(step.name in get_step(n).then for n in chosen):
                chosen.add(step.name)
                grew = True
    return [s.name for s in STEPS if s.name in chosen]


def format_check(verdicts: dict[str, dict]) -> str:
    lines = []
    for name, v in verdicts.items():
        detail = f" (changed: {', '.join(v['changed'])})" if v["changed"] else ""
        lines.append(f"{name:<16} {v['status']}{detail}")
    return "\n".join(lines)
