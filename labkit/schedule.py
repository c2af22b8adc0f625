"""The learning-rate schedule shared by SFT and GRPO (linear warm-up, then linear decay), and the
one clipped update step that applies it (`clipped_step`).

The protocol's GRPO schedule is "warm-up 10% then linear decay to 10% of peak".
The warm start and the additional SFT use the same schedule (the protocol only
names their peak rate): one schedule in the whole lab, and the warm-up keeps the
first updates of a freshly loaded optimizer (whose second-moment estimates are
still empty) small.

The schedule is a pure function of the update index, so a resumed run needs only
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


def clipped_step(optimizer, loss, lr: float, grad_clip: float, *, error_if_nonfinite: bool = False) -> float:
    """The one update step of SFT and GRPO: backward, gradient norm clipped to `grad_clip`, an
    optimizer step at rate `lr`; returns the gradient norm before clipping.

    The caller has zeroed the gradients and computed `loss` (a 0-d tensor).  The norm covers the
    optimizer's own parameters.  (The language-model phases of the tiny base share
    `labkit.answer_phase.clipped_update`, which computes the model's own loss first.)
    """
    import torch

    for group in optimizer.param_groups:
        group["lr"] = lr
    loss.backward()
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip, error_if_nonfinite=error_if_nonfinite)
    optimizer.step()
    return float(grad_norm)
