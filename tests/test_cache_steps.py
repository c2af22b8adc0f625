"""Which cached steps `make cache` rebuilds: the stale ones and everything built from them."""

import pytest

from labkit import steps
from labkit.lab import cache
from labkit.lab.fingerprint import Sources
from labkit.lab.runs import REPO_ROOT


def _verdicts(stale: set[str]) -> dict:
    return {name: {"status": "stale" if name in stale else "fresh", "changed": []} for name in steps.STEP_NAMES}


@pytest.mark.parametrize("stale, expected", [
    ({"base"}, ["base", "warm_start", "sft", "grpo", "evaluation", "group_size", "reward_model", "format_base",
                "grpo_large", "overoptimisation", "gradient_study", "thinking", "reasoning", "skill_test", "crossover",
                "rarer"]),
    ({"warm_start"}, ["warm_start", "sft", "grpo", "evaluation", "group_size", "reward_model", "grpo_large",
                      "overoptimisation", "gradient_study"]),
    ({"grpo_large"}, ["grpo_large"]),
    ({"grpo"}, ["grpo", "evaluation", "group_size"]),
    ({"sft"}, ["sft", "evaluation", "group_size", "reward_model", "overoptimisation"]),
    ({"reward_model"}, ["reward_model", "overoptimisation"]),
    ({"overoptimisation"}, ["overoptimisation"]),
    ({"format_base"}, ["format_base"]),
    ({"evaluation"}, ["evaluation", "group_size"]),
    ({"group_size"}, ["group_size"]),
    ({"gradient_study"}, ["gradient_study"]),
    ({"thinking"}, ["thinking", "reasoning", "skill_test", "crossover"]),
    ({"reasoning"}, ["reasoning", "crossover"]),
    ({"crossover"}, ["crossover"]),
    ({"rarer"}, ["rarer"]),  # a lineage of its own: nothing else is built from it, and it from no thinking base
    (set(), []),
])
def test_a_rebuilt_step_takes_everything_downstream_with_it(stale, expected):
    assert cache.to_rebuild(steps.STEPS, _verdicts(stale)) == expected


def test_the_warm_start_and_the_exercise_name_their_other_outputs():
    assert "sampler_agreement.json" in steps.get_step("warm_start").outputs
    assert set(steps.get_step("group_size").outputs) == {"grpo_g2", "grpo_g8"}


def test_an_unknown_step_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown step 'grpo_g4'"):
        steps.get_step("grpo_g4")


@pytest.mark.parametrize("step", steps.STEPS, ids=steps.STEP_NAMES)
def test_every_step_reaches_its_code_from_entry_points_that_exist(step):
    """Each entry point names a definition of the package, and what it reaches is fingerprinted."""
    table = cache.code_fingerprint(step, SOURCES)
    assert all(entry in SOURCES.reach([entry]) for entry in step.entries)
    assert len(table) > 50, f"{step.name} reaches only {len(table)} definitions"


def test_the_base_leaves_out_only_modules_it_reaches_and_says_why():
    """The base's stated exceptions (steps.BASE_UNRECORDED_WHY) are modules pretraining really reaches:
    none is listed for nothing, and every other module it reaches is in its fingerprint."""
    reached = {key.partition(":")[0] for key in SOURCES.reach(list(steps.get_step("base").entries))}
    assert set(steps.BASE_UNRECORDED) <= reached
    assert steps.BASE_UNRECORDED_WHY
    assert all(not s.unrecorded for s in steps.STEPS if s.name not in ("base", "thinking", "format_base"))


@pytest.mark.parametrize("name, computes", [
    ("thinking", {"labkit.studies.thinking_base", "labkit.train.corpus", "labkit.eval.think_profile",
                  "labkit.models.presets"}),
    ("format_base", {"labkit.studies.format_base", "labkit.train.corpus", "labkit.train.answer_phase",
                     "labkit.models.sampling", "labkit.models.presets"}),
])
def test_the_continued_pretrainings_leave_out_only_the_run_folders_plumbing_and_say_why(name, computes):
    """The thinking and format-base steps' exceptions (steps.THINKING_UNRECORDED_WHY): the folders, the skeleton
    and the states, which they reach; every module that computes a base (the corpus, the phases, the samplers,
    the model) is in the fingerprint."""
    step = steps.get_step(name)
    plumbing = ("labkit.lab.runs", "labkit.lab.skeleton", "labkit.lab.state")
    reached = {key.partition(":")[0] for key in SOURCES.reach(list(step.entries))}
    assert step.unrecorded == steps.THINKING_UNRECORDED == plumbing and set(plumbing) <= reached
    assert steps.THINKING_UNRECORDED_WHY
    recorded = {key.partition(":")[0] for key in cache.code_fingerprint(step, SOURCES)}
    assert computes <= recorded and not set(plumbing) & recorded


def test_no_module_below_the_commands_names_a_higher_layers_file():
    """The step graph lives in labkit/steps.py: no code of lab/ names a module above it, by dotted name or
    by path, in an import or a string (its docstrings may say who uses it)."""
    import ast
    import re

    from labkit.lab.fingerprint import strip_docstrings

    higher = re.compile(r"labkit[./](grpo|eval|studies|train|models|task|book|config|cli|pipeline|steps)\b"
                        r"|^\.\.(grpo|eval|studies|train|models|task|book|config|cli|pipeline|steps)\b")
    for path in sorted((REPO_ROOT / "labkit" / "lab").glob("*.py")):
        tree = strip_docstrings(ast.parse(path.read_text()))
        named = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        named += ["." * node.level + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        assert not [n for n in named if higher.search(n)], f"{path.name} names {[n for n in named if higher.search(n)]}"


SOURCES = Sources.in_folder(REPO_ROOT)


def test_the_committed_base_has_the_architecture_models_builds_today():
    """What the base's unrecorded imports give pretraining: the model's config (steps.BASE_UNRECORDED_WHY).

    The initial weights are not compared: their digest depends on the CPU's kernels (torch's normal_
    draws differently under ATEN_CPU_CAPABILITY=default), and the base was made on one machine."""
    import json

    from labkit.models import presets
    from labkit.lab.runs import REPO_ROOT
    from labkit.models.tokenizer import load_tiny_tokenizer

    built = json.loads(presets.tiny_model_config(load_tiny_tokenizer()).to_json_string())
    assert built == json.loads((REPO_ROOT / "runs" / "tiny" / "base" / "config.json").read_text())


def test_the_committed_base_was_pretrained_with_todays_settings():
    """What config.py gives pretraining besides the architecture: both phases' settings (steps.BASE_UNRECORDED_WHY).
    A change to a default of PretrainConfig or AnswerPhaseConfig fails here until the base is re-pretrained."""
    import json
    from dataclasses import asdict

    from labkit.config import PretrainConfig
    from labkit.lab.runs import REPO_ROOT

    recorded = json.loads((REPO_ROOT / "runs" / "tiny" / "base" / "manifest.json").read_text())["config"]
    assert asdict(PretrainConfig()) == recorded
