"""The instructor's qwen path at full vocabulary (labkit.smoke with 2 layers at a quarter of the width),
and AdamW's decay at the protocol's GRPO rate.

The smoke runs once for the module: Qwen2.5-0.5B-Instruct's architecture with its 151,936-token
vocabulary, 14 query and 2 key/value heads, 2 decoder layers and heads 16 wide instead of 64 (hidden
size 224): every stage and every line of code of the full-size smoke, in about 20 s and 1.6 GiB
instead of 90 s and 5.1 GiB (`make test` must fit a laptop: 8 minutes, 6 GB).  The full-size run,
`python -m labkit smoke --preset qwen --random-weights --device cpu`, is measured in
book/instructor.md.  Every test below reads what the smoke measured and checked, and recomputes
what it can independently.
"""

from __future__ import annotations

import os

import pytest
import torch

from labkit import cli, smoke
from labkit.grpo import losses
from labkit.models import presets, scoring
from labkit.config import QWEN, TINY
from labkit.lab.runs import read_json
from labkit.models.rollouts import decode_response
from labkit.train.schedule import schedule_values

LAYERS = 2
HEAD_DIM = 16  # hidden 14 x 16 = 224, MLP 76 x 16 = 1,216 (Qwen's 896 and 4,864 at head width 64)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    # The protocol's own rewards (random weights earn none, so no update moves a weight): its
    # state's moments are zeros; the default synthetic rewards give dense ones.  The state is
    # stored in gzip's format without compression (level 0): the test checks the save and the
    # bit-for-bit reload, not gzip's speed.  One thread: `make test` runs the smoke beside the two halves
    # of nbval (tests/phases.py), where a second thread only waits for a core (2026-12-07: 172 s of wall
    # time for 59 s of CPU with two).  Its checks hold at any thread count.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = smoke.run_smoke("qwen", random_weights=True, device="cpu", layers=LAYERS, head_dim=HEAD_DIM,
                                 run_dir=run_dir,
                                 max_new_tokens=2, rewards="verifier", progress=False, state_compresslevel=0)
    finally:
        torch.set_num_threads(threads)
    return report, run_dir


def detail(report: dict, stage: str) -> dict:
    (row,) = [r for r in report["stages"] if r["stage"] == stage]
    return row["detail"]


def test_every_stage_ran_and_its_table_is_in_the_run_folder(smoke_run):
    report, run_dir = smoke_run
    assert [r["stage"] for r in report["stages"]] == list(smoke.STAGES)
    assert {r["status"] for r in report["stages"]} == {"ok"}
    assert all(r["seconds"] > 0 and r["host_peak_bytes"] > 0 and r["host_peak_reset_for_stage"]
               for r in report["stages"])
    assert read_json(run_dir / smoke.SMOKE_FILE) == report  # written atomically with every stage
    assert (run_dir / "FINISHED").is_file() and not (run_dir / "work").exists()  # gigabytes removed
    env = report["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["torch_threads"] >= 1
    table = smoke.format_table(report)
    assert all(stage in table for stage in smoke.STAGES) and "peak RSS MiB" in table
    with pytest.raises(FileExistsError, match="holds a finished run"):  # evidence is never overwritten
        smoke.run_smoke("qwen", device="cpu", layers=LAYERS, run_dir=run_dir, progress=False)


def _unique_parameters(c, layers: int) -> int:
    """A tied Qwen2 model's unique parameters, from its config."""
    head_dim = c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * head_dim
    per_layer = (c.hidden_size * c.hidden_size + c.hidden_size      # q with bias
                 + 2 * (c.hidden_size * kv + kv)                     # k, v with bias
                 + c.hidden_size * c.hidden_size                     # o, no bias
                 + 3 * c.hidden_size * c.intermediate_size           # gate, up, down
                 + 2 * c.hidden_size)                                # the two RMS norms
    embedding = c.vocab_size * c.hidden_size  # once: the output head is the same matrix
    return embedding + layers * per_layer + c.hidden_size


def test_the_parameter_count_of_two_layers_follows_from_the_config(smoke_run):
    report, _ = smoke_run
    c = smoke.smoke_model_config(LAYERS, HEAD_DIM)
    assert (c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (
        224, 1216, 14, 2, 151_936)
    built = detail(report, "build")
    assert built["unique_parameters"] == _unique_parameters(c, LAYERS) == 35_899_040
    # the same formula gives the real model at 24 layers and full width
    assert _unique_parameters(smoke.smoke_model_config(24), 24) == presets.QWEN_PARAMETERS == 494_032_768
    assert built["tied"] and built["dtype"] == "torch.float32" and built["attn_implementation"] == "eager"
    # the qwen loader's check refuses the stand-in for exactly its four differences, each named
    assert built["check_qwen"] == ("refused as it must be: config.hidden_size is 224, expected 896; "
                                   "config.intermediate_size is 1216, expected 4864; "
                                   "config.num_hidden_layers is 2, expected 24; "
                                   "35,899,040 unique trainable parameters, expected 494,032,768")
    assert detail(report, "load")["tf32_off"] and not torch.backends.cuda.matmul.allow_tf32


def test_the_stand_in_tokenizer_has_qwens_ids_and_the_embedding_rows_beyond_it(smoke_run):
    report, _ = smoke_run
    tokenizer = smoke.standin_tokenizer()
    assert len(tokenizer) == 151_665 and tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 151_645
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|file_sep|>"]) == [151_643, 151_644,
                                                                                                   151_664]
    assert tokenizer.pad_token_id == 151_643 and tokenizer.bos_token_id is None
    built = detail(report, "build")
    assert built["embedding_rows"] == 151_936 and built["rows_without_a_token"] == 271
    assert built["eos_id"] == 151_645 and built["tokenizer_tokens"] == 151_665
    # an id of the embedding beyond the tokenizer is shown, never dropped, and makes the response invalid
    text, valid = decode_response(tokenizer, [151_700, 151_645])
    assert text == "<|undecodable:151700|>" and not valid
    # the lab's prompt code works with the chat template: Qwen's default system turn, then the user's
    prompt = scoring.build_prompt_ids(tokenizer, "A warehouse holds 3 bolts.")
    decoded = tokenizer.decode(prompt)
    assert decoded.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert decoded.endswith("<|im_end|>\n<|im_start|>assistant\n") and prompt[-5] == 151_645
    assert max(detail(report, "sft_update")["prompt_tokens"]) <= QWEN.max_prompt_tokens


def test_the_kl_in_blocks_of_4096_agrees_with_one_block_of_151936(smoke_run):
    report, _ = smoke_run
    kl = detail(report, "kl_blocks")
    assert (kl["vocab"], kl["block_size"], kl["blocks"], kl["last_block"]) == (151_936, 4096, 38, 384)
    assert kl["ok"] and kl["tolerance_rel"] == 1e-5
    # recomputed here: 37 full blocks and one of 384, against one block and against float64
    g = torch.Generator().manual_seed(7)
    cur, ref = 3 * torch.randn(4, 151_936, generator=g), 3 * torch.randn(4, 151_936, generator=g)
    blocked = losses.exact_prefix_kl(cur, ref, block_size=QWEN.kl_block_size)
    one = losses.exact_prefix_kl(cur, ref, block_size=151_936)
    logp, logq = torch.log_softmax(cur.double(), -1), torch.log_softmax(ref.double(), -1)
    exact = (logp.exp() * (logp - logq)).sum(-1)
    assert float(exact.min()) > 5  # a KL of order 10 per prefix: a relative tolerance means something
    torch.testing.assert_close(blocked.double(), one.double(), rtol=1e-5, atol=0)
    torch.testing.assert_close(blocked.double(), exact, rtol=1e-5, atol=0)


def test_the_samplers_and_the_pre_update_check_agree_at_full_vocabulary(smoke_run):
    report, _ = smoke_run
    reference, fast = detail(report, "grpo_sample_reference"), detail(report, "grpo_sample_fast")
    assert reference["rollouts"] == fast["rollouts"] == 16 and fast["identical_to_reference"] == 16
    assert reference["finish_reasons"] == ["length"] and reference["verifier_reasons"] == ["stopped_at_length"]
    for check in (detail(report, "logprob_check")["fast"], detail(report, "grpo_updates")["logprob_check"]):
        assert check["ok"] and check["max_abs_diff"] <= 2e-4 and check["tokens"] == 32


def test_the_protocols_rewards_leave_every_weight_unchanged(smoke_run):
    """Random weights earn reward 0 everywhere: zero-variance groups give no surrogate gradient, the
    KL between policy and reference is exactly 0 with a zero gradient, and AdamW's decay at these
    rates rounds to a factor of exactly 1: two updates, and not one bit moves."""
    report, _ = smoke_run
    updates = detail(report, "grpo_updates")
    assert updates["rewards_used"] == "verifier" and updates["zero_variance_groups"] == 4
    assert [u["learning_rate"] for u in updates["updates"]] == [5e-08, 1e-07]
    assert all(u["kl"] == 0.0 and u["grad_norm"] == 0.0 for u in updates["updates"])
    assert updates["logits_shape"] == [16, 2, 151_936] and updates["kl_block_size"] == 4096
    assert not updates["weights_changed"] and updates["reference_unchanged"]
    assert detail(report, "sft_update")["weights_changed"]  # the SFT update (lr 4e-6, no decay) does move them


def test_the_full_state_reloads_bit_for_bit(smoke_run):
    report, _ = smoke_run
    saved, reloaded = detail(report, "state_save"), detail(report, "state_reload")
    # every parameter three times (the weights and AdamW's two moments) and one 4-byte step count per
    # parameter tensor (26 of them: the embedding, 12 per layer, the final norm), the embedding once
    assert saved["state_tensor_bytes"] == 3 * 4 * 35_899_040 + 4 * (1 + 12 * LAYERS + 1)
    assert saved["raw_bytes"] > saved["state_tensor_bytes"] and saved["compresslevel"] == 0
    assert saved["raw_bytes"] < saved["bytes"] < saved["raw_bytes"] * 1.001  # stored: gzip's headers only
    assert reloaded["source"] == "core.Loop.restore of the saved file"
    assert reloaded["sections_different"] == []
    assert reloaded["sections_bitwise_equal"] == sorted(["model", "optimizer", "scheduler", "data_order", "generators",
                                                         "rng", "history", "consumed_ids", "identity", "progress"])
    assert reloaded["fresh_model_differed_before_restore"] and reloaded["policy_digest_equal"]
    assert reloaded["next_update"] == 2
    for mode, responses in (("greedy", 2), ("sample", 8)):  # the reloaded policy evaluates
        assert detail(report, f"eval_{mode}")["responses"] == responses


def test_the_smoke_holds_its_folder_through_the_run_skeleton(smoke_run, tmp_path, monkeypatch):
    """labkit.lab.skeleton.holding: the finished smoke folder is refused, untouched; the lock goes when a run
    ends, and when a stage fails too (a notebook or a test process goes on afterwards)."""
    from labkit.lab import runs
    _, run_dir = smoke_run
    assert os.path.realpath(run_dir) not in runs._HELD
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    with pytest.raises(runs.RunExistsError, match="holds a finished run"):
        smoke.run_smoke("qwen", device="cpu", layers=LAYERS, head_dim=HEAD_DIM, run_dir=run_dir, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before

    def broken(s, detail):
        raise RuntimeError("a stage failed")
    monkeypatch.setattr(smoke, "stage_build", broken)
    failed = tmp_path / "failed"
    with pytest.raises(RuntimeError, match="a stage failed"):
        smoke.run_smoke("qwen", device="cpu", layers=LAYERS, head_dim=HEAD_DIM, run_dir=failed, progress=False)
    assert os.path.realpath(failed) not in runs._HELD and not (failed / "FINISHED").exists()
    assert read_json(failed / "smoke.json")["stages"][0]["status"] == "failed"


def test_a_stopped_smoke_is_refused_until_restart_and_a_ctrl_c_names_the_command(tmp_path, monkeypatch):
    """Issue 58, item 1: what a stopped smoke left is never overwritten quietly; a Ctrl-C says what measures again."""
    from labkit.lab.runs import UnfinishedRunError
    from labkit.lab.skeleton import Interrupted

    def ctrl_c(s, detail):
        raise KeyboardInterrupt
    monkeypatch.setattr(smoke, "stage_build", ctrl_c)
    folder = tmp_path / "stopped"
    with pytest.raises(Interrupted, match=r"smoke stopped \(Ctrl-C\); the finished stages' rows are in .*smoke\.json: "
                                          r"measure again with the same command and --restart"):
        smoke.run_smoke("qwen", device="cpu", layers=LAYERS, head_dim=HEAD_DIM, run_dir=folder, progress=False)
    table = (folder / "smoke.json").read_bytes()
    with pytest.raises(UnfinishedRunError, match=r"holds a stopped smoke run \(1 stage\(s\) in smoke\.json\): .* "
                                                 r"pass --restart"):
        smoke.run_smoke("qwen", device="cpu", layers=LAYERS, head_dim=HEAD_DIM, run_dir=folder, progress=False)
    assert (folder / "smoke.json").read_bytes() == table  # untouched

    def broken(s, detail):
        raise RuntimeError("measured again")
    monkeypatch.setattr(smoke, "stage_build", broken)
    with pytest.raises(RuntimeError, match="measured again"):  # --restart: the old table goes, the stages run
        smoke.run_smoke("qwen", device="cpu", layers=LAYERS, head_dim=HEAD_DIM, run_dir=folder, progress=False,
                        restart=True)


@pytest.mark.parametrize("argv, message", [
    (["smoke", "--preset", "tiny", "--random-weights"], "--preset 'tiny': the smoke builds the qwen architecture"),
    (["smoke"], "--random-weights is required"),
    (["smoke", "--random-weights", "--layers", "0"], "--layers 0: must be at least 1"),
    (["smoke", "--random-weights", "--head-dim", "15"], "--head-dim 15: must be an even number in 2..64"),
    (["smoke", "--random-weights", "--max-new-tokens", "65"], "--max-new-tokens 65: must lie in 1..64"),
    (["smoke", "--random-weights", "--eval-problems", "0"], "--eval-problems 0: must be at least 1"),
    (["smoke", "--random-weights", "--device", "tpu"], "--device 'tpu': expected cpu or cuda"),
])
def test_bad_smoke_options_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert cli.main(argv + ["--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# -- AdamW's decoupled decay at the protocol's GRPO rate ----------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _adamw_step(weights: torch.Tensor, grad: torch.Tensor, lr: float, weight_decay: float) -> torch.Tensor:
    """The weights after one torch.optim.AdamW step with gradient `grad` (the lab's optimiser, defaults)."""
    p = torch.nn.Parameter(weights.clone())
    p.grad = grad.clone()
    torch.optim.AdamW([p], lr=lr, weight_decay=weight_decay).step()
    return p.detach()


def _weights() -> torch.Tensor:
    """float32 weights of every kind: initialisation-sized, large, powers of two (where the spacing
    below is half the spacing above), the smallest normal and a subnormal."""
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([1.0, -1.0, 0.5, 2.0, 1024.0, 3.0e38, 1.1754944e-38, 1.0e-40, 0.02, -0.02])
    return torch.cat([0.02 * torch.randn(100_000, generator=g), 10 * torch.randn(1_000, generator=g), special])


def test_the_protocols_weight_decay_rounds_to_a_factor_of_exactly_one():
    lr, wd = QWEN.grpo_lr, QWEN.grpo_weight_decay  # 1e-6 and 0.01
    # AdamW multiplies every weight by 1 - lr * wd = 1 - 1e-8 before its update; the float32 numbers
    # next to 1 are 1 - 2**-24 (5.96e-8 below) and 1 + 2**-23, so 1 - 1e-8 rounds to 1 exactly,
    # and so does it at every smaller rate of the schedule (warm-up from 5e-8, decay to 1e-7).
    assert torch.tensor(1 - lr * wd, dtype=torch.float32).item() == 1.0
    rates = schedule_values(QWEN.grpo_iterations * QWEN.updates_per_iteration, lr, QWEN.warmup_fraction,
                            QWEN.final_lr_fraction)
    assert max(rates) == lr and all(torch.tensor(1 - r * wd, dtype=torch.float32).item() == 1.0 for r in rates)
    # Even kept in double precision, w * (1 - 1e-8) lies within half a spacing of w for every float32 w
    # (the relative half-spacing is at least 2**-25 = 2.98e-8), so it rounds back to w.
    w = _weights()
    assert torch.equal(_bits((w.double() * (1 - lr * wd)).float()), _bits(w))


def test_one_adamw_step_at_the_protocols_rate_leaves_float32_weights_bitwise_unchanged():
    lr, wd = QWEN.grpo_lr, QWEN.grpo_weight_decay
    w = _weights()
    zero = torch.zeros_like(w)
    # With a zero gradient Adam's own update is 0 (moments 0, denominator eps): only the decay acts.
    assert torch.equal(_bits(_adamw_step(w, zero, lr, wd)), _bits(w))
    # Control: at lr 1e-3 the factor is 1 - 1e-5, which moves every normal non-zero weight.
    moved = _bits(_adamw_step(w, zero, 1e-3, wd)) != _bits(w)
    normal = w.abs() >= torch.finfo(torch.float32).tiny
    assert bool(moved[normal].all())
    # With a gradient, the protocol's step equals the step without any decay, bit for bit ...
    grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(_bits(_adamw_step(w, grad, lr, wd)), _bits(_adamw_step(w, grad, lr, 0.0)))
    # ... while at 1e-3 the decay is real.
    assert not torch.equal(_bits(_adamw_step(w, grad, 1e-3, wd)), _bits(_adamw_step(w, grad, 1e-3, 0.0)))


def test_the_tiny_presets_grpo_decay_is_real():
    # tiny's GRPO rate 3e-5 gives 1 - 3e-7, five spacings below 1: its weight decay does act.
    factor = torch.tensor(1 - TINY.grpo_lr * TINY.grpo_weight_decay, dtype=torch.float32).item()
    assert factor == 1 - 5 * 2**-24
    w = _weights()
    assert not torch.equal(_bits(_adamw_step(w, torch.zeros_like(w), TINY.grpo_lr, TINY.grpo_weight_decay)), _bits(w))
