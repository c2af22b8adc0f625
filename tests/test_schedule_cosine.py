"""`schedule.warmup_cosine` is the schedule the committed base was pretrained with, and
`schedule.clipped_step` is the update every phase makes.

The base's logs record the rate of every 100th update of both phases (JSON keeps a float's
shortest repr, so a value read back is the value written).  The rates are plain Python float
arithmetic and `math.cos`; they are compared within 1e-15 relative, a few units in the last place,
so that a libm that rounds cos differently elsewhere does not fail the test.
"""

import json
import math

import pytest
import torch

from labkit.train.answer_phase import AnswerPhaseConfig
from labkit.train.pretrain import PretrainConfig
from labkit.lab.runs import REPO_ROOT
from labkit.train.schedule import clipped_step, lm_update, warmup_cosine

BASE = REPO_ROOT / "runs" / "tiny" / "base"


def rows(path, **where):
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in out if all(r.get(k) == v for k, v in where.items()) and "lr" in r]


def test_the_corpus_phase_rates_are_the_committed_bases():
    cfg = PretrainConfig()
    logged = rows(BASE / "corpus_log.jsonl")
    assert len(logged) == cfg.steps // cfg.log_every  # one rate per 100 updates, 120 of them
    for r in logged:  # the row of update `step` (1-based) logs the rate of update step - 1 (0-based)
        got = warmup_cosine(r["step"] - 1, cfg.steps, cfg.warmup_steps, cfg.peak_lr, floor_fraction=cfg.final_lr_fraction)
        assert got == pytest.approx(r["lr"], rel=1e-15, abs=0.0), r["step"]


def test_the_answer_phase_rates_are_the_committed_bases():
    cfg = AnswerPhaseConfig()
    logged = rows(BASE / "log.jsonl", kind="train")
    assert len(logged) == cfg.steps // cfg.log_every
    for r in logged:
        got = warmup_cosine(r["step"] - 1, cfg.steps, cfg.warmup_steps, cfg.peak_lr, floor=cfg.final_lr)
        assert got == pytest.approx(r["lr"], rel=1e-15, abs=0.0), r["step"]


def test_the_cosine_by_hand():
    # warm-up: (i + 1) / 4 of the peak; then c = (1 + cos(pi * (i - 4) / 6)) / 2, held at the floor after 10
    assert [warmup_cosine(i, 10, 4, 2.0, floor_fraction=0.5) for i in (0, 3)] == [0.5, 2.0]
    assert warmup_cosine(4, 10, 4, 2.0, floor_fraction=0.5) == 2.0
    assert warmup_cosine(7, 10, 4, 2.0, floor_fraction=0.5) == pytest.approx(1.5, rel=1e-15)  # half-way: c = 1/2
    assert warmup_cosine(10, 10, 4, 2.0, floor=0.5) == 0.5 and warmup_cosine(99, 10, 4, 2.0, floor=0.5) == 0.5
    assert warmup_cosine(7, 10, 4, 2.0, floor=0.5) == pytest.approx(0.5 + 1.5 * 0.5 * (1 + math.cos(math.pi / 2)))
    with pytest.raises(ValueError, match="floor_fraction .* or floor"):
        warmup_cosine(5, 10, 4, 2.0)
    with pytest.raises(ValueError, match="floor_fraction .* or floor"):
        warmup_cosine(5, 10, 4, 2.0, floor=0.1, floor_fraction=0.1)


def test_clipped_step_clips_the_norm_and_sets_the_rate():
    """w = (3, 4), loss = w . (1, 1) x 10: gradient (10, 10), norm sqrt(200); SGD at rate 0.5 with the
    norm clipped to 1 moves w by 0.5 x (10, 10) / (sqrt(200) + 1e-6) = (0.3536, 0.3536) (PyTorch's
    clip_grad_norm_ scales by max_norm / (norm + 1e-6))."""
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    optimizer = torch.optim.SGD([w], lr=99.0)
    optimizer.zero_grad()
    norm = clipped_step(optimizer, (w * 10).sum(), 0.5, 1.0)
    assert norm == pytest.approx(math.sqrt(200), rel=1e-15)
    assert optimizer.param_groups[0]["lr"] == 0.5
    step = 0.5 * 10 / (math.sqrt(200) + 1e-6)
    assert w.detach().tolist() == pytest.approx([3.0 - step, 4.0 - step], rel=1e-12)


def test_lm_update_is_the_models_loss_then_the_clipped_step():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))

        def forward(self, x):
            return type("Out", (), {"loss": (self.w * x).sum() ** 2})()

    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    loss, norm = lm_update(model, optimizer, {"x": torch.tensor([1.0, 1.0], dtype=torch.float64)}, 0.1, 100.0)
    # loss = (1 - 2)^2 = 1; gradient 2 (w . x) x = (-2, -2), norm 2 sqrt 2 (below the clip); w -= 0.1 x gradient
    assert loss == 1.0 and norm == pytest.approx(2 * math.sqrt(2), rel=1e-15)
    assert model.w.detach().tolist() == pytest.approx([1.2, -1.8], rel=1e-12)
