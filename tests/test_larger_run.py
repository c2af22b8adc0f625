"""The larger GRPO run's settings: the protocol's loop with a larger batch, its own rate, tiny only."""

import pytest

from labkit.studies import larger_run
from labkit.config import TINY


def test_the_larger_run_changes_only_the_batch_and_the_rate():
    config = larger_run.larger_config("tiny")
    changed = {k for k, v in config.to_dict().items() if TINY.to_dict()[k] != v}
    assert changed <= {"prompts_per_iteration", "G", "grpo_iterations", "grpo_lr"}
    assert config.prompts_per_iteration * config.G == 16 * TINY.prompts_per_iteration * TINY.G
    assert config.updates_per_iteration == TINY.updates_per_iteration and config.kl_coef == TINY.kl_coef
    assert config.fingerprint() != TINY.fingerprint()  # another config names another run


def test_the_qwen_preset_has_no_larger_run():
    with pytest.raises(ValueError, match="has no larger run"):
        larger_run.larger_config("qwen")


def test_its_folders_sit_under_the_presets_runs():
    root = larger_run.run_dir("tiny")
    assert root.parts[-3:] == ("runs", "tiny", "grpo_large")
    assert larger_run.evaluation_root("tiny").parent == root == larger_run.pass_at_k_root("tiny").parent
    assert larger_run.PASS_AT_K_DRAWS == 64 and larger_run.PASS_AT_K_POLICIES == ("warm_start", "grpo_large")
