"""labkit.lab.state: capture / restore / save / load / exact comparison of a full resumable state."""

from __future__ import annotations

import gzip
import io
import random

import numpy as np
import pytest
import torch

from labkit.lab import state


def small_run(seed: int = 0):
    """A small model and AdamW after one step, a data-order generator, and a history."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    loss = model(torch.randn(5, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    generator = torch.Generator().manual_seed(7)
    return model, optimizer, generator, [{"update": 1, "loss": float(loss.detach()), "lr": 1e-2}]


def capture(model, optimizer, generator, history, consumed=("epoch-1/a", "epoch-1/b")):
    return state.capture_state(
        model=model,
        optimizer=optimizer,
        scheduler={"kind": "warmup_linear_decay", "next_update": 1, "total_updates": 4},
        data_order={"epoch": 1, "permutation": [1, 0, 2], "cursor": 2},
        generators={"data_order": generator},
        history=history,
        consumed_ids=list(consumed),
        identity={"branch": "test", "config_fingerprint": "abc"},
        progress={"epochs_done": 1, "updates_done": 1},
    )


def test_roundtrip_save_load_is_equal_and_size_is_measured(tmp_path):
    s = capture(*small_run())
    info = state.save_state(tmp_path / "s.pt.gz", s, evidence={"times": {"train_seconds": 1.5}})
    assert info["bytes"] == (tmp_path / "s.pt.gz").stat().st_size > 0
    raw = gzip.decompress((tmp_path / "s.pt.gz").read_bytes())
    assert len(raw) == info["raw_bytes"] and raw.startswith(state.MAGIC)
    loaded, evidence = state.load_state(tmp_path / "s.pt.gz")
    assert evidence == {"times": {"train_seconds": 1.5}}
    report = state.compare_states(s, loaded)
    assert report["equal"] is True and report["different_fields"] == []
    assert set(report["sections"]) == set(state.STATE_SECTIONS)
    # every tensor of the model and of AdamW is a listed field
    assert report["fields"]["model/0.weight"] == "equal"
    assert report["fields"]["optimizer/state/0/exp_avg_sq"] == "equal"
    assert report["fields"]["rng/torch_cpu"] == "equal"


def test_timings_live_outside_the_compared_state(tmp_path):
    s = capture(*small_run())
    state.save_state(tmp_path / "a.pt.gz", s, evidence={"times": {"train_seconds": 1.0}})
    state.save_state(tmp_path / "b.pt.gz", s, evidence={"times": {"train_seconds": 99.0}})
    assert state.compare_state_files(tmp_path / "a.pt.gz", tmp_path / "b.pt.gz")["equal"] is True


def test_one_tampered_tensor_element_is_named():
    a = capture(*small_run())
    b = capture(*small_run())
    assert state.compare_states(a, b)["equal"] is True
    b["optimizer"]["state"][1]["exp_avg"][1] += 1e-9  # one element of one AdamW moment
    report = state.compare_states(a, b)
    assert report["equal"] is False
    assert report["different_fields"] == ["optimizer/state/1/exp_avg"]
    assert report["fields"]["optimizer/state/1/exp_avg"].startswith("1 of 3 elements differ; first at [1]")
    assert report["sections"]["optimizer"] == {"equal": False, "fields": report["sections"]["optimizer"]["fields"], "different": 1}
    assert report["sections"]["model"]["equal"] is True


def test_one_consumed_random_number_is_named():
    run = small_run()
    a = capture(*run)
    torch.rand(1)  # consumes the global Torch CPU generator, nothing else
    b = capture(*run)
    report = state.compare_states(a, b)
    assert report["equal"] is False
    assert report["different_fields"] == ["rng/torch_cpu"]


def test_the_data_order_generator_and_python_rng_are_compared():
    model, optimizer, generator, history = small_run()
    a = capture(model, optimizer, generator, history)
    random.random()
    torch.randperm(3, generator=generator)
    b = capture(model, optimizer, generator, history)
    # Python's state is (version, 624 words + position, gauss_next): the position moved
    assert state.compare_states(a, b)["different_fields"] == ["generators/data_order", "rng/python/1"]


def test_one_tampered_history_value_is_named():
    a = capture(*small_run())
    b = capture(*small_run())
    b["history"][0]["loss"] = np.nextafter(b["history"][0]["loss"], np.inf).item()  # one ulp
    report = state.compare_states(a, b)
    assert report["equal"] is False and report["different_fields"] == ["history/0/loss"]


def test_exact_means_type_bits_and_shape():
    t = torch.tensor([0.0, float("nan")])
    cases = {
        "int vs float": ({"x": 1}, {"x": 1.0}, False),
        "bool vs int": ({"x": True}, {"x": 1}, False),
        "0.0 vs -0.0": ({"x": 0.0}, {"x": -0.0}, False),
        "same nan": ({"x": float("nan")}, {"x": float("nan")}, True),
        "tensor with nan": ({"x": t}, {"x": t.clone()}, True),
        "tensor -0.0": ({"x": t}, {"x": torch.tensor([-0.0, float("nan")])}, False),
        "dtype": ({"x": torch.zeros(2)}, {"x": torch.zeros(2, dtype=torch.float64)}, False),
        "shape": ({"x": torch.zeros(2)}, {"x": torch.zeros(1, 2)}, False),
        "list order": ({"x": ["a", "b"]}, {"x": ["b", "a"]}, False),
        "tuple vs list": ({"x": (1, 2)}, {"x": [1, 2]}, False),
        "missing key": ({"x": 1, "y": 2}, {"x": 1}, False),
        "array dtype": ({"x": np.zeros(2, np.uint32)}, {"x": np.zeros(2, np.int64)}, False),
    }
    for name, (a, b, expected) in cases.items():
        assert state.compare_states(a, b)["equal"] is expected, name
    assert state.compare_states({"x": 1, "y": 2}, {"x": 1})["fields"]["y"] == "missing in b"
    assert state.compare_states({}, {})["equal"] is False  # nothing compared proves nothing


def test_capture_does_not_alias_live_tensors():
    model, optimizer, generator, history = small_run()
    a = capture(model, optimizer, generator, history)
    before = a["model"]["0.weight"].clone()
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()  # changes the live weights and moments
    history.append({"update": 2})
    assert torch.equal(a["model"]["0.weight"], before)
    assert len(a["history"]) == 1


def test_tied_weights_are_captured_once():
    from labkit.models.presets import new_tiny_model

    model = new_tiny_model(0)
    s = state.capture_state(model=model, optimizer=torch.optim.AdamW(model.parameters()), scheduler={}, data_order={},
                            generators={}, history=[], consumed_ids=[], identity={}, progress={})
    assert s["model"]["lm_head.weight"].data_ptr() == s["model"]["model.embed_tokens.weight"].data_ptr()


def test_restore_into_fresh_objects_continues_identically():
    model, optimizer, generator, history = small_run()
    s = capture(model, optimizer, generator, history)
    expected_draw = (torch.rand(3), random.random(), np.random.rand(), torch.randperm(5, generator=generator))

    fresh_model, fresh_optimizer, fresh_generator, _ = small_run(seed=123)  # other weights, other moments
    torch.manual_seed(999)
    random.seed(999)
    rest = state.restore_state(s, model=fresh_model, optimizer=fresh_optimizer, generators={"data_order": fresh_generator})
    draw = (torch.rand(3), random.random(), np.random.rand(), torch.randperm(5, generator=fresh_generator))
    assert torch.equal(draw[0], expected_draw[0]) and draw[1:3] == expected_draw[1:3]
    assert torch.equal(draw[3], expected_draw[3])
    assert rest["history"] == history and rest["data_order"]["cursor"] == 2
    # the restored objects capture back to the saved state (after re-aligning the RNGs we just used)
    state.restore_rng(s["rng"])
    fresh_generator.set_state(s["generators"]["data_order"])
    again = capture(fresh_model, fresh_optimizer, fresh_generator, rest["history"])
    assert state.compare_states(s, again)["equal"] is True


def test_restore_refuses_an_incomplete_state_or_other_generators():
    model, optimizer, generator, history = small_run()
    s = capture(model, optimizer, generator, history)
    with pytest.raises(ValueError, match="lacks the section"):
        state.restore_state({k: v for k, v in s.items() if k != "rng"}, model=model, optimizer=optimizer,
                            generators={"data_order": generator})
    with pytest.raises(ValueError, match="generators"):
        state.restore_state(s, model=model, optimizer=optimizer, generators={"sampling": generator})


def test_load_refuses_files_the_lab_did_not_write(tmp_path):
    plain = tmp_path / "plain.pt"
    torch.save({"model": {}}, plain)
    with pytest.raises(state.StateFileError, match="not a gzip file"):
        state.load_state(plain)
    foreign = tmp_path / "foreign.pt.gz"
    buffer = io.BytesIO()
    torch.save({state.VERSION_KEY: state.STATE_VERSION, "state": {}, "evidence": {}}, buffer)
    foreign.write_bytes(gzip.compress(buffer.getvalue()))  # right key, but no MAGIC header
    with pytest.raises(state.StateFileError, match="refusing to unpickle"):
        state.load_state(foreign)
    other_version = tmp_path / "v2.pt.gz"
    buffer = io.BytesIO()
    buffer.write(state.MAGIC)
    torch.save({state.VERSION_KEY: 2, "state": {}, "evidence": {}}, buffer)
    other_version.write_bytes(gzip.compress(buffer.getvalue()))
    with pytest.raises(state.StateFileError, match="labkit_state_version=2"):
        state.load_state(other_version)
