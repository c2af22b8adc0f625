"""The chapters' knobs: each slider's callback redraws its figure with the numbers of the new setting.

The widgets are driven as JupyterLab would drive them (a slider's value set, its observer called),
without a browser; the figures' data are read back and compared with the formulas."""

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from labkit.book import knobs
from labkit.grpo import losses  # noqa: E402


def sliders(box):
    return {s.description: s for s in box.children[:-1]}


def test_the_clip_knob_redraws_the_objective_for_the_new_epsilon():
    knob = knobs.clip_epsilon()
    box = knob.widget()
    (slider,) = sliders(box).values()
    assert slider.value == 0.2
    slider.value = 0.1  # what moving the slider does
    top_left = knob.figure.axes[0]
    rho, objective = (torch.tensor(x, dtype=torch.float64) for x in top_left.lines[1].get_data())
    assert torch.allclose(objective, torch.minimum(rho, rho.clamp(0.9, 1.1)), rtol=0, atol=1e-12)


def test_the_clip_panels_equal_the_librarys_surrogate_token_by_token():
    rhos = [0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 1.5]
    for eps in (0.1, 0.2, 0.3):
        for panel in knobs.clipped_objective_panels(rhos, eps):
            for r, o, g in zip(rhos, panel["objective"], panel["gradient"]):
                logp = torch.tensor([[math.log(r)]], dtype=torch.float64, requires_grad=True)
                loss, _ = losses.clipped_surrogate(logp, torch.zeros(1, 1, dtype=torch.float64),
                                                   torch.tensor([panel["advantage"]], dtype=torch.float64),
                                                   torch.ones(1, 1, dtype=torch.bool), clip_eps=eps)
                (grad,) = torch.autograd.grad(-loss, logp)
                assert o == pytest.approx(-loss.item(), abs=1e-12) and g == pytest.approx(grad.item(), abs=1e-12)


def test_the_zero_signal_knobs_move_their_point():
    knob = knobs.zero_signal_vs_p()
    box = knob.widget()
    controls = sliders(box)
    controls["success rate p"].value = 0.25
    controls["group size G"].value = 8
    point = knob.figure.axes[0].collections[-1].get_offsets()[0]
    assert tuple(point) == pytest.approx((0.25, 0.25 ** 8 + 0.75 ** 8), abs=1e-12)

    knob = knobs.zero_signal_vs_group_size(0.556, [])
    box = knob.widget()
    assert sliders(box)["success rate p"].value == 0.56
    sliders(box)["group size G"].value = 8
    point = knob.figure.axes[0].collections[-1].get_offsets()[0]
    assert tuple(point) == pytest.approx((8, 0.56 ** 8 + 0.44 ** 8), abs=1e-12)
    label = knob.figure.axes[0].get_legend().get_texts()[-1].get_text()
    assert f"{8 / (1 - 0.56 ** 8 - 0.44 ** 8):.2f} rollouts per informative group" in label


def test_the_temperature_knob_sharpens_and_flattens_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    knob = knobs.temperature(logits, ["a", "b", "c", "d"], "answer digit 1", G=4, top=4)
    box = knob.widget()
    (slider,) = sliders(box).values()
    heights = lambda: [bar.get_height() for bar in knob.figure.axes[0].patches]  # noqa: E731
    at_one = heights()
    assert at_one == pytest.approx(torch.softmax(logits.double(), 0).tolist(), abs=1e-12)
    slider.value = 0.5
    assert heights()[0] > at_one[0]  # colder: the likeliest token gains
    probs, agree = knobs.temperature_distribution(logits, 0.5)
    assert agree == pytest.approx(sum(p ** 4 for p in probs), abs=1e-15)
    assert f"agree with probability {agree:.3f}" in knob.figure.axes[0].get_title()


def test_settings_outside_a_slider_or_unknown_are_refused():
    knob = knobs.clip_epsilon()
    with pytest.raises(ValueError, match=r"clip_eps=0\.9 lies outside the slider's range \[0\.05, 0\.5\]"):
        knob.update(clip_eps=0.9)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['eps'\]"):
        knob.update(eps=0.1)


def test_show_draws_the_static_figure_where_knobs_are_off(monkeypatch):
    monkeypatch.setenv(knobs.KNOBS_ENV, "0")
    knob = knobs.clip_epsilon()
    assert knob.show() is None
    rho, objective = (torch.tensor(x, dtype=torch.float64) for x in knob.figure.axes[0].lines[1].get_data())
    assert torch.allclose(objective, torch.minimum(rho, rho.clamp(0.8, 1.2)), rtol=0, atol=1e-12)  # the default
