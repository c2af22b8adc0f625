"""Knobs: sliders that redraw a chapter's figure, so that a student can turn the idea in JupyterLab.

Each knob is a pure drawing function of its settings plus the sliders that drive it:

    knob = knobs.clip_epsilon()        # chapter 4: the clipped objective for any clip epsilon
    knob.show()                        # in JupyterLab: the sliders and the figure, redrawn as they move
    fig = knob.update(clip_eps=0.1)    # the same drawing, called directly (what the tests do)

`show()` draws the static figure at the default settings instead of the sliders when the
environment variable LABKIT_KNOBS is "0": the book's builds and nbval set it (a widget's stored
output names a random model id, which would never compare equal), so the book shows the figure at
the default value and the notebooks stay deterministic.  The figures are the chapters' own
(`labkit.book.plots`); the numbers behind them are the library's formulas.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import matplotlib.pyplot as plt

from ..grpo.losses import expected_frac_reward_zero_std  # p^G + (1-p)^G
from . import plots

KNOBS_ENV = "LABKIT_KNOBS"


@dataclass
class Slider:
    """One setting: its range, its step (an int step makes an integer slider) and its default."""

    low: float
    high: float
    step: float
    default: float
    label: str = ""


@dataclass
class Knob:
    """`draw(**settings) -> Figure` and the sliders of its settings."""

    draw: object
    sliders: dict[str, Slider]
    figure: object = field(default=None, repr=False)

    def defaults(self) -> dict:
        return {name: s.default for name, s in self.sliders.items()}

    def update(self, **settings):
        """Redraw with `settings` (the others at their defaults); returns the new figure."""
        unknown = sorted(set(settings) - set(self.sliders))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; this knob has {sorted(self.sliders)}")
        for name, value in settings.items():
            s = self.sliders[name]
            if not s.low <= value <= s.high:
                raise ValueError(f"{name}={value!r} lies outside the slider's range [{s.low}, {s.high}]")
        if self.figure is not None:
            plt.close(self.figure)
        self.figure = self.draw(**{**self.defaults(), **settings})
        return self.figure

    def widget(self):
        """The sliders and an output area (ipywidgets), drawn at the defaults and redrawn on every move."""
        import ipywidgets as widgets
        from IPython.display import display

        controls = {}
        for name, s in self.sliders.items():
            kind = widgets.IntSlider if isinstance(s.step, int) else widgets.FloatSlider
            controls[name] = kind(min=s.low, max=s.high, step=s.step, value=s.default,
                                  description=s.label or name, continuous_update=False,
                                  style={"description_width": "initial"})
        out = widgets.Output()

        def redraw(_change=None):
            figure = self.update(**{name: c.value for name, c in controls.items()})
            with out:
                out.clear_output(wait=True)
                display(figure)

        for control in controls.values():
            control.observe(redraw, names="value")
        redraw()
        return widgets.VBox([*controls.values(), out])

    def show(self):
        """The sliders in JupyterLab; the static figure at the defaults where LABKIT_KNOBS=0 (book, nbval)."""
        if os.environ.get(KNOBS_ENV, "1") == "0":
            self.update()
            plt.show()
            return None
        from IPython.display import display

        display(self.widget())
        return None


# -- chapter 2: temperature ------------------------------------------------------------------------------


def temperature_distribution(logits, temperature: float, G: int = 4) -> tuple[list[float], float]:
    """(softmax(logits / T) as a list, the chance that `G` independent draws all pick the same
    token: the sum of p_v^G).  logits: (V,) of one position.  T = 1 is the distribution the lab samples."""
    import torch

    if not temperature > 0:
        raise ValueError(f"temperature {temperature!r}: must be > 0")
    p = torch.softmax(torch.as_tensor(logits, dtype=torch.float64) / temperature, dim=-1)
    return p.tolist(), float(p.pow(G).sum())


def temperature(logits, labels: list[str], position: str, G: int = 4, top: int = 8) -> Knob:
    """Chapter 2: the next-token distribution at one position of a rollout at temperature T, its `top`
    likeliest tokens, and the chance that a group of `G` would all draw the same one there."""

    def draw(T: float):
        probs, agree = temperature_distribution(logits, T, G)
        order = sorted(range(len(probs)), key=lambda v: -probs[v])[:top]
        fig, ax = plt.subplots(figsize=(6, 2.8))
        ax.bar(range(len(order)), [probs[v] for v in order],
               color=["tab:blue" if T == 1.0 else "tab:purple"] * len(order))
        ax.set_xticks(range(len(order)), [labels[v] for v in order], family="monospace")
        ax.set_ylim(0, 1)
        ax.set_ylabel("probability")
        ax.set_title(f"{position}, temperature {T:g}: {G} draws agree with probability {agree:.3f}",
                     fontsize=9)
        fig.tight_layout()
        return fig

    return Knob(draw, {"T": Slider(0.1, 3.0, 0.1, 1.0, "temperature T")})


# -- chapters 3 and 8: how often a group has no signal ---------------------------------------------------


def zero_signal_vs_p(group_sizes=(2, 4, 8, 16)) -> Knob:
    """Chapter 3: the curves p^G + (1-p)^G against p, and the point of one chosen (p, G)."""
    ps = [i / 200 for i in range(201)]

    def draw(p: float, G: int):
        curves = {g: (ps, [expected_frac_reward_zero_std(x, g) for x in ps]) for g in sorted({*group_sizes, G})}
        point = {"p": p, "fraction": expected_frac_reward_zero_std(p, G), "color": "tab:red", "size": 50,
                 "label": f"p = {p:.2f}, G = {G}: {expected_frac_reward_zero_std(p, G):.3f} of groups silent"}
        return plots.plot_zero_signal_vs_success(curves, [point])

    return Knob(draw, {"p": Slider(0.0, 1.0, 0.01, 0.5, "success rate p"), "G": Slider(2, 32, 1, 4, "group size G")})


def zero_signal_vs_group_size(p_default: float, points: list[dict] | None = None, max_group_size: int = 32) -> Knob:
    """Chapter 8: the curve p^G + (1-p)^G against G for a chosen p (default: the run's), with the runs'
    measured points, and the rollouts per informative group G / (1 - p^G - (1-p)^G) at the chosen G."""

    def draw(p: float, G: int):
        fig = plots.plot_zero_signal_curve(p, points or [], max_group_size=max_group_size, p_label="chosen")
        ax = fig.axes[0]
        silent = expected_frac_reward_zero_std(p, G)
        per_informative = G / (1 - silent) if silent < 1 else math.inf
        ax.scatter([G], [silent], color="tab:red", zorder=4, s=50,
                   label=f"G = {G}: {silent:.3f} silent, {per_informative:.2f} rollouts per informative group")
        ax.legend(fontsize=7, loc="upper right")
        return fig

    return Knob(draw, {"p": Slider(0.0, 1.0, 0.01, round(p_default, 2), "success rate p"),
                       "G": Slider(1, max_group_size, 1, 4, "group size G")})


# -- chapter 4: the clip -------------------------------------------------------------------------------------


def clipped_objective_panels(rhos: list[float], clip_eps: float) -> list[dict]:
    """The panels `plots.plot_clipped_objective` draws, for A = +1 and A = -1: the objective
    min(rho A, clip(rho, 1-eps, 1+eps) A), the unclipped rho A, and the gradient d o / d log rho
    (rho A on the unclipped branch, exactly 0 where the clip acts), in float64 by autograd."""
    import torch

    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must lie in (0, 1), got {clip_eps}")
    panels = []
    for A in (1.0, -1.0):
        log_rho = torch.tensor([math.log(r) for r in rhos], dtype=torch.float64, requires_grad=True)
        rho = log_rho.exp()
        objective = torch.minimum(rho * A, rho.clamp(1 - clip_eps, 1 + clip_eps) * A)
        (gradient,) = torch.autograd.grad(objective.sum(), log_rho)
        panels.append({"advantage": A, "objective": objective.tolist(), "unclipped": (rho * A).tolist(),
                       "gradient": gradient.tolist()})
    return panels


def clip_epsilon(low: float = 0.4, high: float = 1.6, points: int = 241) -> Knob:
    """Chapter 4: the clipped objective and its gradient against rho, for any clip epsilon."""
    rhos = [low + (high - low) * i / (points - 1) for i in range(points)]

    def draw(clip_eps: float):
        return plots.plot_clipped_objective(rhos, clipped_objective_panels(rhos, clip_eps), clip_eps=clip_eps)

    return Knob(draw, {"clip_eps": Slider(0.05, 0.5, 0.05, 0.2, "clip epsilon")})
