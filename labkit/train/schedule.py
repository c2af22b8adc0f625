"""The learning-rate schedules and the one clipped update step that applies them.

SFT and GRPO share `warmup_linear_decay` (below); the tiny base's two pretraining phases share
`warmup_cosine`; every update of the lab, whatever its loss, is `clipped_step`.

`warmup_linear_decay`.  The protocol's GRPO schedule is "warm-up 10% then linear decay to
10% of peak".  The warm start and the additional SFT use the same schedule (the protocol only
names their peak rate): one schedule for every run of the protocol, and the warm-up keeps the
first updates of a freshly loaded optimizer (whose second-moment estimates are still empty)
small.

Each schedule is a pure function of the update index, so a resumed run needs only
the index of its next update to continue exactly: there is no scheduler object
with hidden state to save.

For `total` updates, `warmup = ceil(warmup_fraction * total)` (at least 1), and
update `i` (0-based) uses

    lr(i) = peak * (i + 1) / warmup                                  for i <  warmup
    lr(i) = peak * (1 - (1 - final_fraction) * (i - w1) / (total - 1 - w1))
                                                                     for i >= warmup
with `w1 = warmup - 1`: the last warm-up update uses exactly `peak`, and the last
update of the run uses exactly `final_fraction * peak`.

    total  warmup  first lr       last lr
      48      5    peak / 5       0.1 * peak   (warm start)
     218     22    peak / 22      0.1 * peak   (additional SFT)
     200     20    peak / 20      0.1 * peak   (GRPO: 100 iterations x 2 updates)
"""

from __future__ import annotations

import math


def warmup_updates(total: int, warmup_fraction: float) -> int:
    """Number of warm-up updates: ceil(warmup_fraction * total), at least 1."""
    if total < 1:
        raise ValueError(f"a schedule needs at least 1 update, got total={total}")
    if not 0.0 <= warmup_fraction <= 1.0:
        raise ValueError(f"warmup_fraction must lie in [0, 1], got {warmup_fraction}")
    # round() first so that 0.1 * 200 = 20.000000000000004 does not become 21
    return max(1, math.ceil(round(warmup_fraction * total, 9)))


def warmup_linear_decay(
    update: int, total: int, peak: float, warmup_fraction: float = 0.1, final_fraction: float = 0.1
) -> float:
    """Learning rate of update `update` (0-based) out of `total` (see the module docstring)."""
    if not 0 <= update < total:
        raise ValueError(f"update index must lie in 0..{total - 1}, got {update}")
    if not 0.0 <= final_fraction <= 1.0:
        raise ValueError(f"final_fraction must lie in [0, 1], got {final_fraction}")
    warm = warmup_updates(total, warmup_fraction)
    if update < warm:
        return peak * (update + 1) / warm
    last_warm = warm - 1
    span = total - 1 - last_warm  # > 0 here, since update >= warm implies total > warm
    return peak * (1.0 - (1.0 - final_fraction) * (update - last_warm) / span)


def schedule_values(total: int, peak: float, warmup_fraction: float = 0.1, final_fraction: float = 0.1) -> list[float]:
    """Every update's learning rate, for plots and manifests."""
    return [warmup_linear_decay(i, total, peak, warmup_fraction, final_fraction) for i in range(total)]



def warmup_cosine(update: int, total: int, warmup: int, peak: float, *, floor_fraction: float | None = None,
                  floor: float | None = None) -> float:
    """The tiny base's schedule (its two pretraining phases): linear warm-up over `warmup` updates,
    then a cosine from `peak` down to a floor, reached at update `total` and held after it.

        lr(i) = peak * (i + 1) / warmup                                  for i < warmup
        c     = (1 + cos(pi * min(1, (i - warmup) / max(1, total - warmup)))) / 2
        lr(i) = peak * (floor_fraction + (1 - floor_fraction) * c)       the corpus phase
        lr(i) = floor + (peak - floor) * c                               the answer phase

    The floor is given one way or the other (exactly one of the two): the same curve, in the
    rounding each phase was pretrained with.  Written one way for both, 3,734 of the corpus
    phase's 12,000 rates (or 4,721 of the answer phase's) would change in their last bits, and
    so would the committed base: a new base, not a move.
    """
    if (floor_fraction is None) == (floor is None):
        raise ValueError("warmup_cosine: give the floor as floor_fraction (a share of peak) or floor (a rate)")
    if update < warmup:
        return peak * (update + 1) / warmup
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    if floor is not None:
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return peak * (floor_fraction + (1 - floor_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))


def clipped_step(optimizer, loss, lr: float, grad_clip: float, *, error_if_nonfinite: bool = False) -> float:
    """The one update step of the lab: backward, gradient norm clipped to `grad_clip`, an optimizer
    step at rate `lr`; returns the gradient norm before clipping.

    The caller has zeroed the gradients and computed `loss` (a 0-d tensor): SFT and GRPO their own
    losses, the language-model phases of the tiny base the model's (`lm_update`).  The norm covers
    the optimizer's parameters.
    """
    import torch

    for group in optimizer.param_groups:
        group["lr"] = lr
    loss.backward()
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip, error_if_nonfinite=error_if_nonfinite)
    optimizer.step()
    return float(grad_norm)


def lm_update(model, optimizer, batch: dict, lr: float, grad_clip: float) -> tuple[float, float]:
    """One update of a language-model phase (the corpus and answer phases of the tiny base, the format
    base): the model's own loss on `batch` (labels -100 are not trained on), then `clipped_step`;
    returns (loss, gradient norm before clipping)."""
    loss = model(**batch).loss
    optimizer.zero_grad(set_to_none=True)
    grad_norm = clipped_step(optimizer, loss, lr, grad_clip)
    return float(loss.detach()), grad_norm
