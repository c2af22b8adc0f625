"""Which cached steps `make cache` rebuilds: the stale ones and everything built from them."""

import sys
from pathlib import Path

import pytest

from labkit.lab import cache

sys.path.insert(0, str(Path(__file__).parent))
import test_layers  # noqa: E402  (the import reader)


def _verdicts(stale: set[str]) -> dict:
    return {name: {"status": "stale" if name in stale else "fresh", "changed": []} for name in cache.STEP_NAMES}


@pytest.mark.parametrize("stale, expected", [
    ({"base"}, ["base", "warm_start", "sft", "grpo", "evaluation", "group_size", "reward_model", "format_base",
                "grpo_large", "overoptimisation", "gradient_study", "thinking", "reasoning"]),
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
    ({"thinking"}, ["thinking", "reasoning"]),
    ({"reasoning"}, ["reasoning"]),
    (set(), []),
])
def test_a_rebuilt_step_takes_everything_downstream_with_it(stale, expected):
    assert cache.to_rebuild(_verdicts(stale)) == expected


def test_the_warm_start_and_the_exercise_name_their_other_outputs():
    assert "sampler_agreement.json" in cache.get_step("warm_start").outputs
    assert set(cache.get_step("group_size").outputs) == {"grpo_g2", "grpo_g8"}


def test_an_unknown_step_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown step 'grpo_g4'"):
        cache.get_step("grpo_g4")


def _labkit_imports(module: str, seen: set) -> set:
    """Every labkit module `module` imports, directly or through other labkit modules, anywhere in its
    source (tests/test_layers.py reads the imports); packages' docstring-only __init__ files aside."""
    if module in seen:
        return seen
    seen.add(module)
    for name in test_layers.imports_of(module):
        if test_layers.MODULES[name].name != "__init__.py":
            _labkit_imports(name, seen)
    return seen


def _path(module: str) -> str:
    from labkit.lab.runs import REPO_ROOT

    return str(test_layers.MODULES[module].relative_to(REPO_ROOT))


@pytest.mark.parametrize("step", cache.STEPS, ids=cache.STEP_NAMES)
def test_every_module_a_step_imports_is_one_of_its_inputs(step):
    """A change to any code that made a step makes the step stale (the base's stated exceptions aside)."""
    seen = set()
    by_path = {_path(m): m for m in test_layers.MODULES}
    for name in step.code:
        if name in by_path:
            _labkit_imports(by_path[name], seen)
    missing = sorted(_path(m) for m in seen)
    missing = [m for m in missing if m not in step.code]
    if step.name == "base":
        assert missing == sorted(cache.BASE_UNRECORDED), missing
        assert cache.BASE_UNRECORDED_WHY
    else:
        assert missing == [], f"{step.name} imports {missing} without recording them"


def test_the_committed_base_has_the_architecture_models_builds_today():
    """What the base's unrecorded imports give pretraining: the model's config (cache.BASE_UNRECORDED_WHY).

    The initial weights are not compared: their digest depends on the CPU's kernels (torch's normal_
    draws differently under ATEN_CPU_CAPABILITY=default), and the base was made on one machine."""
    import json

    from labkit.models import presets as models
    from labkit.lab.runs import REPO_ROOT
    from labkit.models.tokenizer import load_tiny_tokenizer

    built = json.loads(models.tiny_model_config(load_tiny_tokenizer()).to_json_string())
    assert built == json.loads((REPO_ROOT / "runs" / "tiny" / "base" / "config.json").read_text())


def test_the_committed_base_was_pretrained_with_todays_settings():
    """What config.py gives pretraining besides the architecture: both phases' settings (cache.BASE_UNRECORDED_WHY).
    A change to a default of PretrainConfig or AnswerPhaseConfig fails here until the base is re-pretrained."""
    import json
    from dataclasses import asdict

    from labkit.config import PretrainConfig
    from labkit.lab.runs import REPO_ROOT

    recorded = json.loads((REPO_ROOT / "runs" / "tiny" / "base" / "manifest.json").read_text())["config"]
    assert asdict(PretrainConfig()) == recorded
