"""The instructor's GPU path, run end to end without the weights: `python -m labkit smoke`.

Instructors run the whole protocol with the real Qwen2.5-0.5B-Instruct on a GPU, after a
download this lab never makes.  This module runs every stage of that path once, at the real
sizes, on weights that need no download:

    model      Qwen2.5-0.5B-Instruct's exact architecture (`models.qwen_config()`): 494,032,768
               unique parameters, tied embeddings, FP32, eager attention, TF32 off, with seeded
               random weights (transformers' own initialisation, std 0.02)
    tokenizer  a stand-in with Qwen's sizes and ids: 151,665 tokens, of which 151,643 regular
               ones (the tiny preset's byte-level BPE, with merges that make each word of Qwen's
               default system prompt one token, filled up with unused byte strings) and Qwen's
               22 added tokens at their real ids (`<|endoftext|>` 151643, the pad;
               `<|im_start|>` 151644; `<|im_end|>` 151645, the EOS; ...), and Qwen2.5's chat
               template with its default system prompt.  A prompt is about 86 tokens, as with
               Qwen's own tokenizer (which the lab cannot download to compare: an estimate).  The
               embedding has 151,936 rows, so the 271 ids from 151,665 up are rows without a
               token, as in the real model.

then, one stage each, by the loops' own functions, not copies of them: SFT's `start_branch` and
`run_epoch`; GRPO's `new_loop` (`start_loop` after its two loads), `draw_prompts`,
`sample_iteration`, `update_iteration` and `record_iteration` (`run_iteration` is these three);
`evaluate.generate_predictions`:

    build                  random weights, the stand-in tokenizer, `models.check_qwen`
    load                   weights and tokenizer written as a model folder and read back by the
                           qwen loader (`models.load("qwen", path=...)`), as after a download
    sft_update             the warm start's first update: 8 examples, AdamW (`sft.run_epoch` of a
                           plan cut to one update, then its validation NLL on one example)
    warm_start_file        `models.save_model`; policy and reference as two loads of that file;
                           the rest of GRPO's setup (`core.new_loop`: AdamW, pool, prompt order,
                           the `core.Loop`) and iteration 1's prompts and seeds (`core.draw_prompts`)
    grpo_sample_reference  4 prompts x G=4, reference sampler (no KV cache), verified, with their
                           rewards and advantages (`core.sample_iteration`)
    grpo_sample_fast       the same 16 rollouts with the fast sampler (KV cache), same seeds
    logprob_check          the pre-update check of the fast sampler's rollouts (its own forward)
    grpo_updates           one reference forward and two updates (`core.update_iteration`: clipped
                           surrogate + 0.02 x the exact KL in blocks of 4,096) on the reference
                           sampler's rollouts, the pre-update check inside the first; the record
                           (`core.record_iteration`)
    kl_blocks              the blocked exact KL and its gradient against one block of 151,936
                           and against float64, on seeded logits of the update's size
    state_save             `core.Loop.capture` + `state.save_state` of the whole run
    state_reload           a fresh model, AdamW, prompt order and generator resumed from the file
                           (`core.Loop.restore`); the state they hold must equal the saved one,
                           every section bit for bit
    eval_greedy            greedy predictions of the first test problem of each population
                           (`evaluate.generate_predictions`), scored by the verifier
    eval_sample            4 seeded samples of each, scored

Random weights answer nothing correctly: every group's rewards are all 0, every group has zero
variance, and the protocol's update has no surrogate gradient; with policy = reference the KL
and its gradient are exactly 0 too, so the update changes nothing.  `rewards="synthetic"` (the
default) then computes the advantages from a fixed pattern (1, 0, 0, 0 in every group) so that
the updates change the weights and AdamW's moments are dense, as in a real run, and the state
stages take a real run's time (zeros compress fast); the verifier's real verdicts are recorded
beside it, and the JSON says which rewards were used.  This is a smoke run, not a training run:
the protocol itself never invents a reward.  `rewards="verifier"` keeps the protocol's rewards
(the unit test's choice: it also shows that such updates move no weight at all).

Each stage's wall time and peak memory are printed and written (`smoke.json`, atomically,
after every stage, so a crash leaves the table up to the stage that failed) into the run
folder, `runs/scratch/smoke-...` by default (git-ignored).  Peak memory: on the CPU the
process's peak resident set (VmHWM, reset before each stage through /proc/self/clear_refs;
without it, the peak so far); on CUDA also `torch.cuda.max_memory_allocated` and
`max_memory_reserved`, reset per stage.  The large intermediate files (model folder,
warm-start file, state file) are deleted after use; their sizes are recorded.

`layers=N` builds the same model with N decoder layers instead of 24, and `head_dim=W` with heads
W wide instead of 64 (Qwen's 14 query and 2 key/value heads and full vocabulary kept, the hidden
and MLP widths scaled with W): the unit tests run 2 layers at W = 16, the same code at a quarter of
the width.  The qwen loader must refuse such a model (it checks every architecture field and the
parameter count), and the smoke checks that it refuses for exactly the fields it changed and the
count; it then loads saved files into a blank model of the same config instead.

Host memory, not the GPU's, limits the state stages.  `state.save_state` streams the
captured copy through gzip into the file (measured on a 1 GiB state: 0.46 x the state on top
of the copy), and `state.load_state` holds the decompressed bytes and then the loaded tensors
(2.0 x at its peak); a qwen state (the model and AdamW's two moments) is 5.9 GB.  Before each, the smoke compares that need
with the memory the machine has available (`MemAvailable`) and, where it does not fit, records
the stage as skipped with both figures instead of letting the kernel kill the process (or a
neighbour); the restore is then checked from the in-memory copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

# Every lab module the stages call is imported here, at the start: a run takes minutes, and a
# module first imported half-way through would be whatever the file holds by then.
from .lab import memory, runtime
from .lab import state as state_lib
from .lab.runs import REPO_ROOT, RunFolder, UnfinishedRunError, display_path, read_json, write_json
from .lab.skeleton import Interrupted, holding
from .lab.runtime import deterministic, seed_everything
from .config import get_preset
from .models import presets, sampling, scoring  # noqa: F401  (scoring: imported now, see above)
from .models.tokenizer import ASSET_DIR
from .train import sft
from .grpo import core, losses, variants
from .grpo.loop import PROTOCOL_TASK
from .eval import agreement, evaluate

SMOKE_FILE = "smoke.json"
SMOKE_FORMAT = "labkit smoke v1"
STAGES = ("build", "load", "sft_update", "warm_start_file", "grpo_sample_reference", "grpo_sample_fast",
          "logprob_check", "grpo_updates", "kl_blocks", "state_save", "state_reload", "eval_greedy", "eval_sample")
WEIGHTS_SEED = 0  # the smoke's random weights (the protocol's own seeds are used for everything else)
CPU_MAX_NEW_TOKENS = 8  # short responses on the CPU (a 24-layer step costs about a second there)
SYNTHETIC_REWARDS = (1.0, 0.0, 0.0, 0.0)  # per group, when every group has zero variance (see the docstring)
KL_TOLERANCE = 1e-5  # relative; the blocked KL against one block of 151,936 and against float64
GIB = 1024 ** 3

# -- 1. The stand-in tokenizer -------------------------------------------------------------------

# Qwen2.5's added tokens, in id order from 151643 (its tokenizer_config.json); the last eight are
# added but not "special" there (they survive skip_special_tokens), and are not here either.
QWEN_ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
)
QWEN_FIRST_ADDED_ID = 151643  # = the number of regular (BPE) tokens
QWEN_TOKENIZER_SIZE = QWEN_FIRST_ADDED_ID + len(QWEN_ADDED_TOKENS)  # 151,665
QWEN_EOS_ID = 151645
QWEN_PAD_ID = 151643
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Qwen2.5's chat template without its tool-calling branches: a system turn (its default
# prompt when the messages bring none), then ChatML turns, then the assistant header.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + QWEN_DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _filler_tokens(taken: set[str], count: int) -> list[str]:
    """`count` byte-level strings not in `taken`: every pair of the 256 byte symbols, then triples.

    Real BPE vocabularies are exactly such multi-byte strings; these are never produced by
    the merges (so encoding is the tiny tokenizer's), but each decodes to bytes, as a real
    token does, when a random model samples it.
    """
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    out = []
    for length in (2, 3):
        for combo in itertools.product(alphabet, repeat=length):
            text = "".join(combo)
            if text not in taken:
                out.append(text)
                if len(out) == count:
                    return out
    raise ValueError(f"cannot make {count} filler tokens")


def _whole_word_merges(spec: dict, text: str) -> list[list[str]]:
    """BPE merges (appended after the tiny ones) that make each word of `text` one token.

    The tiny BPE never saw Qwen's default system prompt and spells it in 49 pieces; Qwen's
    own tokenizer, trained on far more text, needs about 18.  Chaining each word's pieces
    (p1 + p2, then (p1p2) + p3, ...) brings the stand-in's prompts to about the real length,
    so the measured times are those of prompts of the real size.
    """
    from tokenizers import Tokenizer

    base = Tokenizer.from_str(json.dumps(spec))
    merges = []
    for word, _ in base.pre_tokenizer.pre_tokenize_str(base.normalizer.normalize_str(text)):
        pieces = [t.value for t in base.model.tokenize(word)]
        for piece in pieces[1:]:
            pair = [pieces[0], piece]
            if pair not in merges:
                merges.append(pair)
            pieces[0] += piece
    return merges


def standin_tokenizer():
    """A `PreTrainedTokenizerFast` with Qwen2.5's sizes and special ids (no download).

    Regular ids 0..151642: the tiny preset's byte-level BPE (its 491 tokens, same
    normaliser, pre-tokenizer and merges, so prompts encode as in the tiny preset)
    followed by unused byte strings; ids 151643..151664: Qwen's 22 added tokens;
    len() = 151,665, as the real tokenizer.  EOS `<|im_end|>` = 151645, pad
    `<|endoftext|>` = 151643, no BOS, Qwen2.5's chat template (default system prompt).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads((ASSET_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(spec["model"]["vocab"])
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("the tiny tokenizer's BPE ids are not 0..n-1; the stand-in assumes they are")
    for pair in _whole_word_merges(spec, QWEN_DEFAULT_SYSTEM):
        spec["model"]["merges"].append(pair)
        vocab.setdefault("".join(pair), len(vocab))
    for text in _filler_tokens(set(vocab), QWEN_FIRST_ADDED_ID - len(vocab)):
        vocab[text] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [
        {"id": QWEN_FIRST_ADDED_ID + k, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special}
        for k, (text, special) in enumerate(QWEN_ADDED_TOKENS)
    ]
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        chat_template=QWEN_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,  # Qwen2.5's tokenizer_config.json
    )
    check_standin_tokenizer(fast)
    return fast


def check_standin_tokenizer(tokenizer) -> None:
    """Refuse (ValueError) a tokenizer without Qwen's size and special ids."""
    problems = []
    if len(tokenizer) != QWEN_TOKENIZER_SIZE:
        problems.append(f"{len(tokenizer):,} tokens, expected {QWEN_TOKENIZER_SIZE:,}")
    for k, (text, _) in enumerate(QWEN_ADDED_TOKENS):
        if tokenizer.convert_tokens_to_ids(text) != QWEN_FIRST_ADDED_ID + k:
            problems.append(f"{text} has id {tokenizer.convert_tokens_to_ids(text)}, expected {QWEN_FIRST_ADDED_ID + k}")
    if tokenizer.eos_token_id != QWEN_EOS_ID or tokenizer.pad_token_id != QWEN_PAD_ID:
        problems.append(f"EOS / pad ids {tokenizer.eos_token_id} / {tokenizer.pad_token_id}, "
                        f"expected {QWEN_EOS_ID} / {QWEN_PAD_ID}")
    if problems:
        raise ValueError("the stand-in tokenizer is not Qwen-shaped: " + "; ".join(problems))


# -- 2. The model --------------------------------------------------------------------------------


QWEN_HEAD_DIM = 64  # Qwen2.5-0.5B-Instruct: 14 query heads x 64 = 896, 2 key/value heads, MLP 4,864 = 76 x 64
MLP_PER_HEAD_DIM = 76


def smoke_model_config(layers: int = 24, head_dim: int = QWEN_HEAD_DIM):
    """Qwen2.5-0.5B-Instruct's `Qwen2Config` (eager), with `layers` decoder layers instead of 24.

    head_dim: the width of an attention head (64: Qwen's).  A narrower stand-in keeps Qwen's 14
    query heads, 2 key/value heads and full vocabulary, and scales the widths with it: hidden size
    14 x head_dim, MLP 76 x head_dim (the unit test uses 16: the same code on a quarter of the width).
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"--layers {layers!r}: must be at least 1 (24 is Qwen2.5-0.5B-Instruct)")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not 2 <= head_dim <= QWEN_HEAD_DIM \
            or head_dim % 2:
        raise ValueError(f"--head-dim {head_dim!r}: must be an even number in 2..{QWEN_HEAD_DIM} "
                         f"(rotary embeddings pair a head's dimensions; {QWEN_HEAD_DIM} is Qwen2.5-0.5B-Instruct)")
    config = presets.qwen_config()
    config.num_hidden_layers = layers
    if hasattr(config, "layer_types") and config.layer_types is not None:  # transformers 5 keeps one per layer
        config.layer_types = config.layer_types[:1] * layers
    if head_dim != QWEN_HEAD_DIM:
        config.hidden_size = config.num_attention_heads * head_dim
        config.intermediate_size = MLP_PER_HEAD_DIM * head_dim
        if getattr(config, "head_dim", None) is not None:
            config.head_dim = head_dim
    return config


def random_model(config, seed: int, device: str):
    """The architecture of `config` with seeded random weights, FP32, eval mode, on `device`.

    Initialised on the CPU, then moved: the same seed gives the same weights on every device.
    """
    from transformers import Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):  # the weights' seed must not reseed the caller's generator
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    return model.to(device).eval()


def blank_model(config, device: str):
    """The architecture of `config` with uninitialised weights (tied), for loading a saved file into.

    Skips the random initialisation (seconds at the full vocabulary): every tensor is then
    overwritten by `models.load_state_into` or `state.restore_state`, which refuse a missing one.
    The rotary buffers are computed in the constructor, as always.
    """
    from transformers import Qwen2ForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = Qwen2ForCausalLM(config)
    model.tie_weights()  # no_init_weights skips the tying too
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        raise RuntimeError("the blank model's embeddings are not tied")
    return model.to(torch.float32).to(device).eval()


SMOKE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers")  # what smoke_model_config may change


def expected_refusal(config) -> list[str]:
    """What `models.check_qwen` must say of a model with `config` (none for the real 24 layers at full
    width): each changed field, in the loader's order, then the parameter count."""
    changed = [f"config.{key} is {getattr(config, key)!r}, expected {presets.QWEN_ARCH[key]!r}"
               for key in presets.QWEN_ARCH if key in SMOKE_FIELDS and getattr(config, key) != presets.QWEN_ARCH[key]]
    return changed + ["unique trainable parameters, expected 494,032,768"] if changed else []


def check_architecture(model, config) -> str:
    """Run the qwen loader's check: it accepts Qwen's 24 layers at full width, and refuses a smaller model
    for exactly the reasons `expected_refusal` names."""
    expected = expected_refusal(config)
    try:
        presets.check_qwen(model)
    except ValueError as err:
        problems = str(err).split(": ", 1)[1].split("; ")
        if expected and len(problems) == len(expected) and all(e in p for e, p in zip(expected, problems)):
            return f"refused as it must be: {'; '.join(problems)}"
        raise
    if expected:
        raise RuntimeError(f"models.check_qwen accepted a model with {config.num_hidden_layers} layers and hidden "
                           f"size {config.hidden_size}")
    return "accepted"


# -- 3. Measuring a stage ------------------------------------------------------------------------


class StageMeter:
    """Wall time and peak memory of one stage: `with meter.stage(name) as detail: ...`.

    Each finished stage is a dict: stage, status ("ok", "skipped", "failed"), seconds,
    host_peak_bytes (and whether it was reset for the stage), and on CUDA
    cuda_max_allocated_bytes / cuda_max_reserved_bytes; `detail` holds what the stage checked.
    """

    def __init__(self, device: str, on_update=None, progress: bool = True):
        self.device, self.on_update, self.progress = device, on_update, progress
        self.rows: list[dict] = []

    @contextlib.contextmanager
    def stage(self, name: str, what: str = ""):
        index = STAGES.index(name) + 1
        if self.progress:
            print(f"smoke [{index:2d}/{len(STAGES)}] {name}: {what}", flush=True)
        gc.collect()  # what earlier stages freed is not charged to this one
        cuda = self.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        reset = memory.reset_host_peak()
        row = {"stage": name, "status": "running"}
        detail: dict = {}
        began = time.perf_counter()
        try:
            yield detail
            row["status"] = detail.pop("status", "ok")
        except BaseException as err:
            row["status"] = "failed"
            row["error"] = f"{type(err).__name__}: {err}"
            raise
        finally:
            if cuda:
                torch.cuda.synchronize(self.device)
            row["seconds"] = time.perf_counter() - began
            row["host_peak_bytes"] = memory.host_peak_bytes()
            row["host_peak_reset_for_stage"] = reset
            if cuda:
                row["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
                row["cuda_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved(self.device))
            row["detail"] = detail
            self.rows.append(row)
            if self.progress:
                print(f"smoke [{index:2d}/{len(STAGES)}] {name}: {row['status']} in {row['seconds']:.1f} s, "
                      f"{memory_text(row)}", flush=True)
            if self.on_update is not None:
                self.on_update()


def memory_text(row: dict) -> str:
    text = f"peak RSS {row['host_peak_bytes'] / 2**20:,.0f} MiB"
    if "cuda_max_allocated_bytes" in row:
        text += (f", CUDA allocated {row['cuda_max_allocated_bytes'] / 2**20:,.0f} MiB"
                 f" / reserved {row['cuda_max_reserved_bytes'] / 2**20:,.0f} MiB")
    return text


def format_table(report: dict) -> str:
    """The stage table as text: seconds and peak memory (MiB = 2**20 bytes) per stage."""
    cuda = any("cuda_max_allocated_bytes" in r for r in report["stages"])
    head = f"{'stage':<22} {'status':<8} {'seconds':>8} {'peak RSS MiB':>13}"
    if cuda:
        head += f" {'CUDA alloc MiB':>15} {'CUDA resv MiB':>14}"
    lines = [head, "-" * len(head)]
    for r in report["stages"]:
        line = f"{r['stage']:<22} {r['status']:<8} {r['seconds']:>8.1f} {r['host_peak_bytes'] / 2**20:>13,.0f}"
        if cuda:
            line += (f" {r.get('cuda_max_allocated_bytes', 0) / 2**20:>15,.0f}"
                     f" {r.get('cuda_max_reserved_bytes', 0) / 2**20:>14,.0f}")
        lines.append(line)
    lines.append(f"{'total':<22} {'':<8} {report['total_seconds']:>8.1f}")
    return "\n".join(lines)


def environment(device: str) -> dict:
    """Versions, device, driver and the machine's memory, for the table's header."""
    import numpy
    import safetensors
    import tokenizers

    env = {
        **runtime.environment(device),  # what every run records; the rest is the smoke's own
        "platform": platform.platform(),
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": numpy.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "host_memory_total_bytes": memory.meminfo_bytes("MemTotal"),
        "host_memory_available_bytes_at_start": memory.meminfo_bytes("MemAvailable"),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env.update(
            cuda_runtime=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            gpu=props.name,
            gpu_memory_bytes=int(props.total_memory),
            gpu_capability=f"{props.major}.{props.minor}",
            nvidia_driver=_nvidia_driver(),
        )
    return env


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version from nvidia-smi (torch does not report it), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


# -- 4. The run: shared objects, then one function per stage ------------------------------------


@dataclass
class Smoke:
    """What the stages share.  Tensors live on `device`; files go under `run_dir / "work"`."""

    config: object  # the protocol's PresetConfig (qwen)
    model_config: object  # the Qwen2Config actually built
    device: str
    run_dir: Path
    max_new_tokens: int
    eval_problems: int
    rewards: str
    progress: bool
    state_compresslevel: int = 1
    tokenizer: object = None
    model: object = None  # until GRPO starts; from then on the loop's
    reference: object = None
    loop: object = None  # the `core.Loop`: policy, reference, AdamW, pool, order, generator, history
    chosen: list = field(default_factory=list)  # iteration 1's 4 pool problems
    seeds: list = field(default_factory=list)  # and their P x G sampling seeds
    sampled: dict = field(default_factory=dict)  # sampler -> its `core.Sampled` (P groups of G rollouts)
    start_digest: str | None = None  # policy = reference at the start of GRPO
    policy_digest: str | None = None  # the policy after the updates, as saved in the state
    section_digests: dict | None = None  # of the saved state, section by section
    snapshot: dict | None = None

    @property
    def full(self) -> bool:
        """The real 24 layers: the qwen loader accepts the model, so the smoke loads through it."""
        return not expected_refusal(self.model_config)

    @property
    def work(self) -> Path:
        return self.run_dir / "work"

    def load_policy(self, state_file: Path | None = None):
        """A model as the protocol loads one: the qwen loader on the model folder, then `state_file`
        (24 layers); with fewer layers, which the loader refuses, a blank model of the same config
        and `models.load_state_into`.  Without `state_file` (a model to restore a state into), the
        weights are the model folder's (24 layers) or uninitialised: not the ones to be restored."""
        if self.full:
            model, _ = presets.load("qwen", state=state_file, path=self.work / "qwen-standin", device=self.device)
            return model
        model = blank_model(self.model_config, self.device)
        if state_file is not None:
            presets.load_state_into(model, state_file)
        return model


def free(*names: str, smoke: Smoke) -> None:
    """Drop the named objects of `smoke` (and of its loop) and return their memory (on CUDA too)."""
    for name in names:
        setattr(smoke, name, None)
        if smoke.loop is not None and hasattr(smoke.loop, name):
            setattr(smoke.loop, name, None)
    gc.collect()
    if smoke.device.startswith("cuda"):
        torch.cuda.empty_cache()


def stage_build(s: Smoke, detail: dict) -> None:
    s.tokenizer = standin_tokenizer()
    s.model = random_model(s.model_config, WEIGHTS_SEED, s.device)
    embedding = s.model.get_input_embeddings().weight
    detail.update(
        layers=s.model_config.num_hidden_layers,
        unique_parameters=presets.count_unique_parameters(s.model),
        tied=s.model.lm_head.weight is embedding,
        dtype=str(embedding.dtype),
        attn_implementation=s.model.config._attn_implementation,
        embedding_rows=int(embedding.shape[0]),
        tokenizer_tokens=len(s.tokenizer),
        rows_without_a_token=int(embedding.shape[0]) - len(s.tokenizer),
        eos_id=s.tokenizer.eos_token_id,
        pad_id=s.tokenizer.pad_token_id,
        check_qwen=check_architecture(s.model, s.model_config),
    )


def stage_load(s: Smoke, detail: dict) -> None:
    """Write the model folder a download gives (config, safetensors, tokenizer) and load it as the lab does."""
    from transformers import AutoTokenizer

    folder = s.work / "qwen-standin"
    s.model.save_pretrained(folder)
    s.tokenizer.save_pretrained(folder)
    detail["folder_bytes"] = sum(p.stat().st_size for p in folder.iterdir())
    built = presets.parameter_digest(s.model)
    if s.full:
        # The instructor's load: find_qwen_dir, AutoTokenizer, from_pretrained FP32 eager, check_qwen, TF32 off.
        free("model", smoke=s)
        s.model, s.tokenizer = presets.load("qwen", path=folder, device=s.device)
        detail["loader"] = "models.load('qwen', path=...): accepted"
    else:
        # The loader refuses fewer layers (checked in build); its tokenizer load is the same call.
        s.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        detail["loader"] = "AutoTokenizer.from_pretrained (presets.check_qwen refuses fewer than 24 layers)"
    check_standin_tokenizer(s.tokenizer)
    loaded = presets.parameter_digest(s.model)
    if loaded != built:
        raise RuntimeError(f"the model folder loads with digest {loaded[:16]}..., it was written with {built[:16]}...")
    detail.update(parameter_digest=loaded, tf32_off=not torch.backends.cuda.matmul.allow_tf32,
                  dtype=str(next(s.model.parameters()).dtype), training=s.model.training)


def stage_sft_update(s: Smoke, detail: dict) -> None:
    """The warm start's first update, made by SFT's own loop: `sft.start_branch` (examples, identity),
    `Branch.start_optimizer` (AdamW, the data-order generator) and `sft.run_epoch`, with the
    branch's plan cut to one update per epoch (its schedule is the full run's, so the update has the
    first update's rate) and one validation example for the epoch's validation NLL."""
    plan = dataclasses.replace(sft.make_plan(s.config, "warm_start"), updates_per_epoch=1)
    branch = sft.start_branch(s.config, plan, lambda: (s.model, s.tokenizer), validation_limit=1,
                              expected_start=None, start_description=None)
    branch.start_optimizer()
    seed_everything(s.config.seed)
    before = presets.parameter_digest(s.model)
    with deterministic(s.device):
        sft.run_epoch(branch, 1, sft._progress_bar(plan, 0, 1, enabled=False))  # SFT's own bar, silent
    record = branch.history[-1]
    detail.update({k: v for k, v in record.items() if k != "example_ids"})  # sft_update's own history record
    chosen = branch.data_order["permutation"][: branch.data_order["cursor"]]
    detail.update(examples=len(chosen), prompt_tokens=[len(branch.examples[i].prompt_ids) for i in chosen],
                  validation_nll=branch.progress["validation"][-1]["nll"],
                  weights_changed=presets.parameter_digest(s.model) != before)
    del branch  # the GRPO run starts a fresh AdamW from the warm-start file


def stage_warm_start_file(s: Smoke, detail: dict) -> None:
    """`models.save_model`, then the policy and the reference as two loads of that file, and the rest of
    GRPO's setup (`grpo.start_loop`'s work)."""
    path = s.work / "warm_start.safetensors"
    saved = presets.parameter_digest(s.model)
    presets.save_model(s.model, path)
    detail["file_bytes"] = path.stat().st_size
    free("model", smoke=s)
    s.model = s.load_policy(path)
    s.reference = s.load_policy(path)
    s.reference.requires_grad_(False)
    s.model.eval()
    s.reference.eval()
    policy, reference = presets.parameter_digest(s.model), presets.parameter_digest(s.reference)
    if not policy == reference == saved:
        raise RuntimeError(f"policy {policy[:16]}, reference {reference[:16]} and saved {saved[:16]} differ")
    path.unlink()
    detail.update(parameter_digest=policy, reloaded_equal=True)
    s.start_digest = policy
    prepare_grpo(s)


def new_smoke_loop(s: Smoke, model, reference) -> core.Loop:
    """GRPO's stage 0 after the two loads, by `core.new_loop` (the second half of `grpo.start_loop`): AdamW,
    pool, prompt order, generation generator and identity in a `core.Loop`, whose `capture` makes the
    run's state; the protocol's variant, resolved once."""
    config = s.config.with_overrides(max_new_tokens=s.max_new_tokens)
    return core.new_loop(config, config.G, config.grpo_iterations, model, reference, s.tokenizer, s.start_digest,
                         start_label="smoke warm start", sampler="reference", device=s.device,
                         resolved=variants.resolve(variants.Variant(), config), task=PROTOCOL_TASK,
                         extra_identity={"smoke_layers": s.model_config.num_hidden_layers})


def prepare_grpo(s: Smoke) -> None:
    """The run's loop (`new_smoke_loop`); then iteration 1's prompts and seeds by `core.draw_prompts`."""
    seed_everything(s.config.seed)
    s.loop = new_smoke_loop(s, s.model, s.reference)
    s.chosen, s.seeds = core.draw_prompts(s.loop)


def stage_sample(s: Smoke, detail: dict, sampler: str) -> None:
    """G responses to each of the 4 prompts with `sampler`, verified, their rewards and advantages:
    `core.sample_iteration`, the loop's own stages 1-3."""
    with deterministic(s.device):
        s.sampled[sampler] = core.sample_iteration(s.loop, 0, sampler, s.chosen, s.seeds)
    groups = s.sampled[sampler].groups
    rollouts = [r for g in groups for r in g.rollouts]
    detail.update(rollouts=len(rollouts), prompt_tokens=[len(g.prompt_ids) for g in groups],
                  generated_tokens=sum(len(r.response_ids) for r in rollouts),
                  finish_reasons=sorted({r.finish_reason for r in rollouts}),
                  verifier_reasons=sorted({v.reason or "correct" for g in groups for v in g.verdicts}),
                  undecodable_rollouts=sum(not r.tokenization_valid for r in rollouts),
                  max_generated_id=max(max(r.response_ids) for r in rollouts))
    if sampler == "fast":
        reference = s.sampled["reference"].rollouts
        same = sum(a.response_ids == b.response_ids for a, b in zip(reference, rollouts))
        detail["identical_to_reference"] = same
        if same != len(rollouts):
            # equal tokens are the tested claim; a near-tie may part them, and is then explained
            detail["mismatches"] = [agreement.explain_mismatch(s.model, a, b) for a, b in zip(reference, rollouts)
                                    if a.response_ids != b.response_ids]


def stage_logprob_check(s: Smoke, detail: dict) -> None:
    """The pre-update check (strict: above 2e-4 it raises) on the fast sampler's rollouts, by its own
    forward; the reference sampler's rollouts are checked inside the first update, as the loop does."""
    rollouts = s.sampled["fast"].rollouts
    with deterministic(s.device):
        check = sampling.check_recorded_logprobs(s.model, rollouts, tol=s.config.logprob_check_tol)
    detail["fast"] = {k: check[k] for k in ("ok", "max_abs_diff", "tol", "tokens")}


def stage_grpo_updates(s: Smoke, detail: dict) -> None:
    """Iteration 1's updates on the reference sampler's rollouts by `core.update_iteration`, the loop's
    own stages 4-5 (one reference forward, two updates, the pre-update check inside the first), and
    its record by `core.record_iteration`."""
    loop, config = s.loop, s.loop.config
    P, G = config.prompts_per_iteration, loop.G
    sampled = s.sampled["reference"]
    rewards = sampled.optimised  # (P, G): the verifier's (the protocol's variant)
    zero_std = losses.zero_variance_groups(rewards)  # (P,)
    if s.rewards == "synthetic" and bool(zero_std.all()):
        used = torch.tensor(SYNTHETIC_REWARDS[:G]).expand(P, G).clone()  # see the module docstring
        sampled = dataclasses.replace(sampled, optimised=used, advantages=loop.resolved.advantages(used).reshape(-1))
    before = presets.parameter_digest(loop.model)
    with deterministic(s.device):
        updates, check = core.update_iteration(loop, sampled)
        loop.optimizer.zero_grad(set_to_none=True)  # the gradients are not part of a state
    loop.history.append(core.record_iteration(loop, 0, sampled, updates, check)[0])  # as core.run_iteration does
    rows = sampled.rollouts
    detail.update(
        verifier_rewards=rewards.tolist(),
        zero_variance_groups=int(zero_std.sum()),
        rewards_used="verifier" if sampled.optimised is rewards else f"synthetic {list(SYNTHETIC_REWARDS[:G])} per "
                                                                     "group: every group had zero variance (random "
                                                                     "weights answer nothing)",
        logprob_check={k: check[k] for k in ("ok", "max_abs_diff", "tol", "tokens")},
        batch_shape=[len(rows), max(len(r.prompt_ids) + len(r.response_ids) for r in rows)],
        logits_shape=[len(rows), max(len(r.response_ids) for r in rows), s.model_config.vocab_size],
        kl_block_size=config.kl_block_size,
        updates=updates,
        weights_changed=presets.parameter_digest(loop.model) != before,
        reference_unchanged=presets.parameter_digest(loop.reference) == loop.reference_digest,
    )
    if not detail["reference_unchanged"]:
        raise RuntimeError("the reference changed during the updates; it must stay frozen")


def kl_agreement(rows: int, vocab: int, block_size: int, device: str, seed: int = 0) -> dict:
    """The blocked exact KL against one block of `vocab` and against float64, on seeded logits.

    Logits (rows, vocab) with standard deviation 3 (peaked next-token distributions, a KL of
    order 10 per prefix), on `device`.  Returns the largest relative differences of the KL
    values and of their gradient with respect to the current logits.
    """

    g = torch.Generator().manual_seed(seed)
    cur = (3 * torch.randn(rows, vocab, generator=g)).to(device).requires_grad_(True)
    ref = (3 * torch.randn(rows, vocab, generator=g)).to(device)
    blocked = losses.exact_prefix_kl(cur, ref, block_size=block_size)  # (rows,)
    (grad_blocked,) = torch.autograd.grad(blocked.sum(), cur)
    one = losses.exact_prefix_kl(cur, ref, block_size=vocab)
    (grad_one,) = torch.autograd.grad(one.sum(), cur)
    with torch.no_grad():
        logp, logq = torch.log_softmax(cur.double(), -1), torch.log_softmax(ref.double(), -1)
        exact = (logp.exp() * (logp - logq)).sum(-1)

    def rel(a, b):
        a, b = a.detach().double(), b.detach().double()
        return float((a - b).abs().max() / b.abs().max())

    out = {
        "rows": rows, "vocab": vocab, "block_size": block_size,
        "blocks": -(-vocab // block_size), "last_block": vocab - (vocab // block_size) * block_size or block_size,
        "kl_mean": float(exact.mean()),
        "kl_blocked_vs_one_block_rel": rel(blocked, one),
        "kl_blocked_vs_float64_rel": rel(blocked, exact),
        "kl_one_block_vs_float64_rel": rel(one, exact),
        "grad_blocked_vs_one_block_rel": rel(grad_blocked, grad_one),
        "tolerance_rel": KL_TOLERANCE,
    }
    out["ok"] = max(out[k] for k in out if k.endswith("_rel") and k != "tolerance_rel") <= KL_TOLERANCE
    return out


def stage_kl_blocks(s: Smoke, detail: dict) -> None:
    rows = s.config.prompts_per_iteration * s.config.G * s.max_new_tokens  # the update's prefixes
    detail.update(kl_agreement(rows, s.model_config.vocab_size, s.config.kl_block_size, s.device))
    if not detail["ok"]:
        raise RuntimeError(f"the blocked KL disagrees beyond {KL_TOLERANCE:g}: {detail}")


def tensor_digest(obj) -> str:
    """SHA-256 over every leaf of a nested state (tensors by dtype, shape and bytes; scalars by repr).

    Equal digests mean bitwise-equal states; computed without copying the whole state.
    """
    h = hashlib.sha256()

    def walk(x, path: str) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous()
            h.update(f"{path}|{t.dtype}|{tuple(t.shape)}\n".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy())  # the buffer itself: no copy of the bytes
        elif isinstance(x, np.ndarray):  # NumPy's RNG state
            h.update(f"{path}|{x.dtype}|{x.shape}\n".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif isinstance(x, dict):
            for key in sorted(x, key=lambda k: (type(k).__name__, str(k))):
                walk(x[key], f"{path}/{key}")
        elif isinstance(x, (list, tuple)):
            h.update(f"{path}|{type(x).__name__}|{len(x)}\n".encode())
            for i, v in enumerate(x):
                walk(v, f"{path}/{i}")
        else:
            h.update(f"{path}|{x!r}\n".encode())

    walk(obj, "")
    return h.hexdigest()


def section_digests(state: dict) -> dict[str, str]:
    """`tensor_digest` of each section of a state: equal digests mean bitwise-equal sections."""
    return {name: tensor_digest(value) for name, value in sorted(state.items())}


def state_bytes(model, optimizer) -> int:
    """Bytes of the tensors a state holds: the model's unique tensors and the optimizer's."""
    seen, total = set(), 0
    for t in list(model.state_dict().values()) + [v for st in optimizer.state.values() for v in st.values()]:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.numel() * t.element_size()
    return total


# Host memory the state functions hold at their peak, in multiples of the state's tensor bytes
# (measured on a 1 GiB state: save_state 0.46 x on top of the captured copy, load_state 2.0 x):
SAVE_MEMORY_FACTOR = 2  # the captured copy, and torch.save's buffers as they stream through gzip
LOAD_MEMORY_FACTOR = 2  # the decompressed bytes, then those and the loaded tensors
MEMORY_MARGIN = 1 * GIB


def memory_fits(need: int) -> tuple[bool, int | None]:
    """(does `need` bytes fit in MemAvailable with a margin?, MemAvailable); True where unknown."""
    available = memory.meminfo_bytes("MemAvailable")
    return (available is None or need + MEMORY_MARGIN <= available), available


def stage_state_save(s: Smoke, detail: dict) -> None:
    """The run's full state after iteration 1, captured (`core.Loop.capture`) and saved as the loop does."""
    loop = s.loop
    free("reference", smoke=s)  # not part of a state, and not needed after the updates
    size = state_bytes(loop.model, loop.optimizer)
    # The live model and optimizer are freed after the capture (the copy holds everything; on a GPU
    # they are in device memory anyway), so on the CPU their memory counts as available.
    live = size if s.device == "cpu" else 0
    need = SAVE_MEMORY_FACTOR * size
    fits, available = memory_fits(need - live)
    detail.update(state_tensor_bytes=size, estimated_need_bytes=need,
                  available_bytes=None if available is None else available + live)
    s.policy_digest = presets.parameter_digest(loop.model)
    snapshot = loop.capture(1)
    s.section_digests = section_digests(snapshot)
    free("model", "optimizer", smoke=s)
    s.snapshot = snapshot
    if not fits:
        detail["status"] = "skipped"
        detail["reason"] = (f"state.save_state would need about {need / GIB:.1f} GiB of host memory "
                            f"({SAVE_MEMORY_FACTOR} x the state's {size / GIB:.1f} GiB), "
                            f"{detail['available_bytes'] / GIB:.1f} GiB are available")
        return
    info = state_lib.save_state(s.work / "state.pt.gz", snapshot, compresslevel=s.state_compresslevel)
    detail.update({k: info[k] for k in ("bytes", "raw_bytes", "save_seconds")}, compresslevel=s.state_compresslevel)


def stage_state_reload(s: Smoke, detail: dict) -> None:
    """A fresh model, AdamW, prompt order and generator resumed from the saved state (`core.Loop.restore`:
    `state.load_state`, the identity check, `state.restore_state`); the state they then hold, captured
    again, must equal the saved one bit for bit, section by section."""
    path = s.work / "state.pt.gz"
    size = state_bytes_of_snapshot(s.snapshot)
    # load_state's peak, plus (on the CPU) the fresh model it restores into; the snapshot is freed first
    need = LOAD_MEMORY_FACTOR * size + (state_bytes_of_snapshot({"model": s.snapshot["model"]}) if s.device == "cpu" else 0)
    fits, available = memory_fits(need - size)
    detail.update(state_tensor_bytes=size, estimated_need_bytes=need,
                  available_bytes=None if available is None else available + size)
    if path.exists() and fits:
        free("snapshot", smoke=s)  # compared through its digests from here on
    model = s.load_policy()  # other weights than the saved ones
    before_restore = presets.parameter_digest(model)
    fresh = new_smoke_loop(s, model, None)  # a fresh AdamW, prompt order and generator, as a resumed run has
    if path.exists() and fits:
        iteration, _ = fresh.restore(path)
        detail["source"] = "core.Loop.restore of the saved file"
    else:
        plain = state_lib.restore_state(s.snapshot, model=fresh.model, optimizer=fresh.optimizer,
                                        generators={"generation": fresh.generation})
        fresh.order.restore(plain["data_order"])
        fresh.history, fresh.consumed = plain["history"], plain["consumed_ids"]
        fresh.next_update, iteration = plain["scheduler"]["next_update"], plain["progress"]["iteration"]
        free("snapshot", smoke=s)
        detail["status"] = "skipped"
        detail["source"] = "the in-memory snapshot: state.restore_state checked, the file round trip not"
        restored_into = ", and the model it restores into" if s.device == "cpu" else ""
        detail["reason"] = (f"state.load_state would need about {need / GIB:.1f} GiB of host memory "
                            f"({LOAD_MEMORY_FACTOR} x the state's {size / GIB:.1f} GiB{restored_into}), "
                            f"{detail['available_bytes'] / GIB:.1f} GiB are available"
                            if path.exists() else "the state was not saved (state_save skipped)")
    path.unlink(missing_ok=True)
    again = section_digests(fresh.capture(iteration))
    different = sorted(k for k in s.section_digests if again.get(k) != s.section_digests[k])
    detail.update(
        sections_bitwise_equal=sorted(k for k in s.section_digests if k not in different),
        sections_different=different,
        fresh_model_differed_before_restore=before_restore != s.policy_digest,
        policy_digest_equal=presets.parameter_digest(fresh.model) == s.policy_digest,
        next_update=fresh.next_update,
    )
    if different or not detail["fresh_model_differed_before_restore"] or not detail["policy_digest_equal"]:
        raise RuntimeError(f"the state does not reload exactly: {detail}")
    s.loop, s.model = fresh, fresh.model  # the run continues from the reload


def state_bytes_of_snapshot(snapshot: dict) -> int:
    """Bytes of the tensors of a captured state's model and optimizer sections (each storage once)."""
    seen, total = set(), 0

    def walk(x):
        nonlocal total
        if isinstance(x, torch.Tensor):
            if x.untyped_storage().data_ptr() not in seen:
                seen.add(x.untyped_storage().data_ptr())
                total += x.numel() * x.element_size()
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk({k: snapshot[k] for k in ("model", "optimizer") if k in snapshot})
    return total


def stage_evaluate(s: Smoke, detail: dict, mode: str) -> None:
    """Predictions of the first problems of each test population, as `evaluate.run_inference` makes them."""
    statements = evaluate.load_test_statements(s.eval_problems)  # phase "inference": statements only
    digest = presets.parameter_digest(s.model)
    with deterministic(s.device, warn_only=True):  # evaluation's setting: it only reads the model
        rows = evaluate.generate_predictions(s.model, s.tokenizer, statements, mode, sampler=evaluate.DEFAULT_SAMPLER,
                                             draws=s.config.eval_draws, max_new_tokens=s.max_new_tokens,
                                             batch_size=s.config.eval_batch_size, policy_digest=digest)
    if presets.parameter_digest(s.model) != digest:
        raise RuntimeError(f"the policy changed during {mode} generation")
    labels = {r["id"]: r for r in evaluate.load_test_labels(phase=evaluate.SCORING_PHASE, limit=s.eval_problems)}
    scored = evaluate.score_rows(rows, labels)
    evaluate.check_complete(rows, [st["id"] for st in statements], s.config.eval_draws, mode)
    detail.update(problems=len(statements), responses=len(rows),
                  generated_tokens=sum(r["response_tokens"] for r in rows),
                  reasons={k: v for k, v in evaluate.reason_counts(scored).items() if v})


# -- 5. The whole run --------------------------------------------------------------------------------


def default_run_dir(device: str, layers: int, head_dim: int = QWEN_HEAD_DIM) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    width = "" if head_dim == QWEN_HEAD_DIM else f"-hd{head_dim}"
    return REPO_ROOT / "runs" / "scratch" / f"smoke-qwen-{device.split(':')[0]}-{layers}l{width}-{stamp}"


REWARDS = ("synthetic", "verifier")


def check_arguments(preset: str, random_weights: bool, device: str, layers: int, max_new_tokens: int,
                    eval_problems: int, rewards: str, head_dim: int = QWEN_HEAD_DIM) -> None:
    """Refuse (ValueError) what the smoke cannot do, naming the value and the rule."""
    from .models.scoring import MAX_NEW_TOKENS

    if preset != "qwen":
        raise ValueError(f"--preset {preset!r}: the smoke builds the qwen architecture (the tiny preset runs "
                         "for real in minutes: python -m labkit all --preset tiny)")
    if not random_weights:
        raise ValueError("--random-weights is required: the smoke needs no download and builds seeded random "
                         "weights; the real weights run the protocol itself (python -m labkit all --preset qwen)")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: expected cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is visible (torch.cuda.is_available() is False)")
    smoke_model_config(layers, head_dim)  # refuses a bad layer count or head width
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"--max-new-tokens {max_new_tokens}: must lie in 1..{MAX_NEW_TOKENS} (the response limit)")
    if eval_problems < 1:
        raise ValueError(f"--eval-problems {eval_problems}: must be at least 1")
    if rewards not in REWARDS:
        raise ValueError(f"--rewards {rewards!r}: expected one of {REWARDS}")


def run_smoke(preset: str = "qwen", *, random_weights: bool = True, device: str | None = None, layers: int = 24,
              head_dim: int = QWEN_HEAD_DIM, run_dir: str | Path | None = None, max_new_tokens: int | None = None,
              eval_problems: int = 1, rewards: str = "synthetic", progress: bool = True,
              state_compresslevel: int = 1, restart: bool = False) -> dict:
    """Run every stage once (see the module docstring); returns the report written to `smoke.json`.

    device          cpu or cuda (default: cuda when present)
    layers          decoder layers (24: Qwen2.5-0.5B-Instruct; the tests use 2)
    head_dim        attention head width (64: Qwen2.5-0.5B-Instruct; the tests use 16, a quarter of
                    the widths at the full vocabulary: see smoke_model_config)
    max_new_tokens  response limit of every sampler call (default: 8 on the CPU, the protocol's 64 on CUDA)
    eval_problems   test problems per population in the two evaluation stages
    rewards         "synthetic": when every group has zero variance (random weights always give that),
                    advantages from the pattern 1, 0, 0, 0 per group, so the updates change the
                    weights and AdamW's moments are dense, as in a real run (the default: its times
                    are a real run's); "verifier": the protocol's own rewards, whose zero-variance
                    groups leave every weight bitwise unchanged (the unit test's choice: zero
                    moments compress fast)
    run_dir         the run folder (default runs/scratch/smoke-qwen-<device>-<layers>l-<UTC time>);
                    a finished run there is refused, never overwritten
    state_compresslevel  the state file's gzip level: 1 as the lab's runs save it (float32 weights
                    compress at about 30 MB/s); 0 stores them in the same format (the unit test:
                    it checks the save and the reload, not gzip's speed)
    restart         delete what a stopped smoke left in `run_dir` and measure again (without it, such a
                    folder is refused: the stages are measured in one go, so there is nothing to resume)

    A Ctrl-C stops it at once with `skeleton.Interrupted`, naming the partial table (every finished
    stage's row) and the command that measures again.
    """

    device = device or presets.default_device("qwen")
    max_new_tokens = max_new_tokens or (CPU_MAX_NEW_TOKENS if device == "cpu" else get_preset("qwen").max_new_tokens)
    check_arguments(preset, random_weights, device, layers, max_new_tokens, eval_problems, rewards, head_dim)
    folder = RunFolder(run_dir or default_run_dir(device, layers, head_dim))
    with holding(folder):  # the run skeleton's first stage: a finished run is refused, the lock released at the end
        if (folder / SMOKE_FILE).is_file():  # what a stopped smoke left: refused unless restart, never overwritten
            if not restart:
                stages = len(read_json(folder / SMOKE_FILE).get("stages", []))
                raise UnfinishedRunError(
                    f"{display_path(folder.path)} holds a stopped smoke run ({stages} stage(s) in {SMOKE_FILE}): its "
                    "stages are measured in one go, so there is nothing to resume; pass --restart to delete it and "
                    "measure again, or leave --run-dir out for a new folder")
            folder.clear((SMOKE_FILE,))
        try:
            return _run_stages(folder, preset, device, layers, head_dim, max_new_tokens, eval_problems, rewards,
                               progress, state_compresslevel)
        except KeyboardInterrupt as err:
            if isinstance(err, Interrupted):
                raise
            raise Interrupted(f"smoke stopped (Ctrl-C); the finished stages' rows are in "
                              f"{display_path(folder / SMOKE_FILE)}: measure again with the same command and "
                              "--restart (or without --run-dir, into a new folder)") from None


def _run_stages(folder: RunFolder, preset: str, device: str, layers: int, head_dim: int, max_new_tokens: int,
                eval_problems: int, rewards: str, progress: bool, state_compresslevel: int) -> dict:
    """run_smoke's body, inside the held run folder: every stage, the report, then FINISHED."""
    run_dir = folder.path
    presets.disable_tf32()  # FP32 means FP32 (the qwen loader does the same)
    s = Smoke(config=get_preset("qwen"), model_config=smoke_model_config(layers, head_dim), device=device,
              run_dir=run_dir, max_new_tokens=max_new_tokens, eval_problems=eval_problems, rewards=rewards,
              progress=progress, state_compresslevel=state_compresslevel)
    report = {
        "format": SMOKE_FORMAT,
        "preset": preset,
        "random_weights": True,
        "layers": layers,
        "head_dim": head_dim,
        "device": device,
        "max_new_tokens": max_new_tokens,
        "eval_problems_per_population": eval_problems,
        "rewards": rewards,
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_dir": display_path(run_dir),  # repository-relative where inside it
        "environment": environment(device),
        "command": " ".join(sys.argv) if sys.argv and sys.argv[0] else None,
        "peak_memory": "host: the process's peak resident set per stage (VmHWM, reset per stage where "
                       "host_peak_reset_for_stage); CUDA: torch.cuda.max_memory_allocated / reserved, reset per stage",
        "stages": [],
        "total_seconds": 0.0,
    }
    began = time.perf_counter()

    def write() -> None:
        report["total_seconds"] = time.perf_counter() - began
        write_json(run_dir / SMOKE_FILE, report)

    meter = StageMeter(device, on_update=write, progress=progress)
    report["stages"] = meter.rows
    if progress:
        print(f"smoke: Qwen2.5-0.5B-Instruct architecture, {layers} layers, random weights, on {device} "
              f"({torch.get_num_threads()} threads), responses up to {max_new_tokens} tokens; into {run_dir}",
              flush=True)
    # (stage name, what it does, the stage function, its extra arguments), in the protocol's order
    stages = [
        ("build", "random weights and the stand-in tokenizer", stage_build, ()),
        ("load", "model folder written and read back by the qwen loader", stage_load, ()),
        ("sft_update", "one warm-start update of 8 examples", stage_sft_update, ()),
        ("warm_start_file", "save_model; policy and reference loaded from it; GRPO's setup", stage_warm_start_file, ()),
        *[(f"grpo_sample_{sampler}", f"4 prompts x G=4, {sampler} sampler", stage_sample, (sampler,))
          for sampler in ("reference", "fast")],
        ("logprob_check", "the fast sampler's recorded log-probs re-scored", stage_logprob_check, ()),
        ("grpo_updates", "two updates, exact KL in blocks of 4,096, check in update 1", stage_grpo_updates, ()),
        ("kl_blocks", "blocked KL vs one block vs float64 at the full vocabulary", stage_kl_blocks, ()),
        ("state_save", "capture and save the full state", stage_state_save, ()),
        ("state_reload", "load and restore the state, compare bitwise", stage_state_reload, ()),
        *[(f"eval_{mode}", f"{mode} predictions of {2 * eval_problems} test problems", stage_evaluate, (mode,))
          for mode in ("greedy", "sample")],
    ]
    try:
        for name, what, run_stage, extra in stages:
            with meter.stage(name, what) as d:
                run_stage(s, d, *extra)
    finally:
        write()
        shutil.rmtree(s.work, ignore_errors=True)  # gigabytes of intermediate files: sizes are recorded
    folder.mark_finished({"stages": len(meter.rows), "total_seconds": report["total_seconds"]})
    return report


def print_report(report: dict) -> None:
    """The header (device, driver, versions), the stage table, skipped stages' reasons, where it was written."""
    env = report["environment"]
    print(f"device {env['device']}" + (f" ({env['gpu']}, driver {env['nvidia_driver']}, CUDA {env['cuda_runtime']})"
                                       if "gpu" in env else f" ({env['cpu_model']}, {env['torch_threads']} threads)"))
    print(f"python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
          f"tokenizers {env['tokenizers']}, safetensors {env['safetensors']}, numpy {env['numpy']}")
    print(format_table(report))
    for row in report["stages"]:
        if row["status"] != "ok":
            print(f"{row['stage']} {row['status']}: {row['detail'].get('reason') or row.get('error')}")
    print(f"wrote {Path(report['run_dir']) / SMOKE_FILE}")
