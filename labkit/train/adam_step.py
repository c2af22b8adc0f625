"""Adam's step does not follow the loss's scale; SGD's does (issue 40, chapter 6).

Adam keeps running means of each coordinate's gradient (m) and squared gradient (v) and steps by
lr x m_hat / (sqrt(v_hat) + eps).  At the first step m_hat = g and v_hat = g^2, so the step is

    lr x g / (|g| + eps)  =  lr x sign(g)      wherever |g| is well above eps (1e-8),

the same size for a loss scaled by 0.01 or by 100.  SGD steps by lr x g: a hundred times the loss
is a hundred times the step.  So with Adam a gradient that says almost nothing (nearly all its
advantages 0) still moves every weight it touches by about the learning rate; its direction, not
its size, carries what the gradient knows.

`one_step_sizes` measures it: one step of each optimiser from the same weights, on the same loss
times each scale, and the size of the step per weight, in units of the learning rate.
"""

from __future__ import annotations

from typing import Callable

import torch

SCALES = (0.01, 1.0, 100.0)
OPTIMISERS = ("adam", "sgd")


def step_size(before: list[torch.Tensor], after: list[torch.Tensor], touched: list[torch.Tensor], lr: float) -> dict:
    """The step's size per weight, in units of lr, over the weights whose gradient is not exactly 0.

    before, after: the parameters around the step; touched: bool masks of the same shapes.
    Returns {"median": the median |after - before| / lr, "max": the largest, "weights": how many}."""
    moved = torch.cat([((a - b).abs() / lr)[t] for b, a, t in zip(before, after, touched)])
    if moved.numel() == 0:
        raise ValueError("no weight has a non-zero gradient: the loss does not depend on the parameters")
    return {"median": float(moved.median()), "max": float(moved.max()), "weights": int(moved.numel())}


def one_step_sizes(load_model: Callable[[], torch.nn.Module], loss_of: Callable[[torch.nn.Module], torch.Tensor],
                   lr: float, scales: tuple[float, ...] = SCALES) -> list[dict]:
    """One step of Adam (torch's AdamW, weight decay 0, so that only the gradient's step is seen) and
    one of plain SGD, each from a fresh `load_model()`, on `scale x loss_of(model)` for each scale.

    The model steps in float64: in float32, SGD's step on a loss times 0.01 (about 1e-9 here) is
    below the spacing of the weights and would vanish altogether.
    Returns one row per (optimiser, scale): {"optimiser", "scale", "median", "max", "weights"}, the
    sizes as `step_size` measures them (in units of lr)."""
    rows = []
    for optimiser in OPTIMISERS:
        for scale in scales:
            model = load_model().double()  # float64: an SGD step far below float32's spacing is still seen
            params = [p for p in model.parameters() if p.requires_grad]
            step = (torch.optim.AdamW(params, lr=lr, weight_decay=0.0) if optimiser == "adam"
                    else torch.optim.SGD(params, lr=lr))
            step.zero_grad(set_to_none=True)
            (scale * loss_of(model)).backward()
            before = [p.detach().clone() for p in params]
            touched = [p.grad != 0 if p.grad is not None else torch.zeros_like(p, dtype=torch.bool) for p in params]
            step.step()
            rows.append({"optimiser": optimiser, "scale": scale,
                         **step_size(before, [p.detach() for p in params], touched, lr)})
    return rows
