"""Chapter 3's checker names the mistake a wrong answer makes, before anything else."""

from __future__ import annotations

import pytest
import torch

from labkit.book.exercises import ExerciseError, check_ch03_group_advantages
from labkit.grpo.losses import group_advantages


def test_the_reference_passes(capsys):
    assert check_ch03_group_advantages(group_advantages) is True
    assert "Correct" in capsys.readouterr().out


def test_a_global_mean_and_std_gets_the_within_each_group_hint():
    def global_stats(rewards):
        r = rewards.detach()
        return (r - r.mean()) / (r.std(correction=0) + 1e-8)

    with pytest.raises(ExerciseError, match=r"mean and std are taken within each group") as err:
        check_ch03_group_advantages(global_stats)
    assert "centring in floating point" not in str(err.value)


def test_a_constant_group_left_unzeroed_gets_the_zeroing_hint():
    def unzeroed(rewards):
        r = rewards.detach()
        centred = r - r.mean(dim=1, keepdim=True)
        return centred / (centred.pow(2).mean(dim=1, keepdim=True).sqrt() + 1e-8)

    with pytest.raises(ExerciseError, match=r"detect constant groups"):
        check_ch03_group_advantages(unzeroed)


def test_the_sample_std_gets_its_own_hint():
    def sample_std(rewards):
        r = rewards.detach()
        out = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-8)
        return torch.where(r.std(dim=1, keepdim=True) == 0, torch.zeros_like(out), out)

    with pytest.raises(ExerciseError, match=r"population std"):
        check_ch03_group_advantages(sample_std)
