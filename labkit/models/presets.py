"""The two model presets: a tiny Qwen2 the lab pretrains itself, and Qwen2.5-0.5B-Instruct.

Both are `transformers.Qwen2ForCausalLM` with eager attention and tied input /
output embeddings, so every line of labkit runs unchanged on either.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..lab.runs import REPO_ROOT, atomic_write_bytes, check_recorded_digest
from ..config import QWEN, TINY
from .tokenizer import load_tiny_tokenizer

if TYPE_CHECKING:  # the classes are imported where a model is built: `import labkit` stays light (5 s less)
    from transformers import Qwen2Config, Qwen2ForCausalLM

# The tiny architecture is a field of the tiny preset's config (labkit.config): about 1M
# parameters, an embedding with more rows than the tokenizer has tokens (512 > 494), as Qwen's
# (151,936 > 151,665), so an undecodable generated id is a real case.
TINY_ARCH = {**asdict(TINY.architecture), "attn_implementation": "eager"}


def tiny_model_config(tokenizer=None) -> Qwen2Config:
    """The tiny preset's `Qwen2Config`, with the tokenizer's special ids."""
    from transformers import Qwen2Config

    tokenizer = tokenizer or load_tiny_tokenizer()
    cfg = Qwen2Config(
        **TINY_ARCH,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return cfg


def new_tiny_model(seed: int = 0, tokenizer=None) -> Qwen2ForCausalLM:
    """A randomly initialised tiny model (pretraining starts here), FP32, eval mode."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_model_config(tokenizer))
    model.to(torch.float32)
    return model.eval()


# ---------------------------------------------------------------------------
# The qwen preset: Qwen2.5-0.5B-Instruct, offline, FP32, eager, checked on load
# ---------------------------------------------------------------------------

QWEN_REPO_ID = "Qwen/Qwen2.5-0.5B-Instruct"
QWEN_REVISION = QWEN.qwen_revision
QWEN_PARAMETERS = 494_032_768  # unique trainable parameters (embedding counted once: it is tied)
QWEN_DIR_ENV = "LABKIT_QWEN_DIR"
# What to download (all of it is in the repository at QWEN_REVISION) ...
QWEN_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
)
# ... and what loading actually opens: a folder without these is not a Qwen folder.
QWEN_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# Qwen2.5-0.5B-Instruct's published config.json, the fields that fix the architecture.
QWEN_ARCH = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
    hidden_act="silu",
    bos_token_id=151643,
    eos_token_id=151645,
)


def qwen_config() -> Qwen2Config:
    """The `Qwen2Config` of Qwen2.5-0.5B-Instruct (eager attention)."""
    from transformers import Qwen2Config

    return Qwen2Config(**QWEN_ARCH, attn_implementation="eager")


def qwen_architecture() -> Qwen2ForCausalLM:
    """Qwen2.5-0.5B-Instruct's architecture on the meta device: shapes only, no memory, no weights."""
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen_config())
    return model.eval()


def unique_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) once per parameter object, in module order.

    Tied weights are one object under two names (`model.embed_tokens.weight`
    and `lm_head.weight`); the first name is kept, so they are counted once.
    """
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def count_unique_parameters(model: torch.nn.Module, trainable_only: bool = True) -> int:
    """Number of scalars over unique parameters (tied weights once); works on the meta device."""
    return sum(p.numel() for _, p in unique_parameters(model) if p.requires_grad or not trainable_only)


def _config_value(cfg, key: str):
    """A config field; transformers 5 keeps rope_theta inside `rope_parameters`."""
    if key == "rope_theta":
        rope = getattr(cfg, "rope_parameters", None) or {}
        return rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    return getattr(cfg, key, None)


def check_qwen_config_file(path: str | os.PathLike) -> None:
    """Refuse (ValueError, one line naming the file) a config.json that is not Qwen2.5-0.5B-Instruct's.

    Read before any weight is built or loaded: a folder holding another model's files would
    otherwise build that model at its own size first.  A field the file leaves out takes
    `Qwen2Config`'s default, as transformers would."""
    from transformers import Qwen2Config

    import json

    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a JSON config ({err}); download it again from {QWEN_REPO_ID}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not a model config object")
    problems = []
    if config.get("model_type") != "qwen2":
        problems.append(f"model_type is {config.get('model_type')!r}, expected 'qwen2'")
    if "architectures" in config and "Qwen2ForCausalLM" not in (config["architectures"] or []):
        problems.append(f"architectures is {config.get('architectures')!r}, expected ['Qwen2ForCausalLM']")
    # A Qwen2Config of the file's fields: numbers only, nothing built; it reads each field as
    # transformers would (rope_theta from `rope_parameters` or the top level, defaults for the rest).
    try:
        parsed = Qwen2Config(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a Qwen2 config ({err})") from None
    for key, expected in QWEN_ARCH.items():
        got = _config_value(parsed, key)
        if got != expected:
            problems.append(f"{key} is {got!r}, expected {expected!r}")
    if problems:
        raise ValueError(f"{path} is not {QWEN_REPO_ID}'s config: " + "; ".join(problems))


def check_qwen(model) -> None:
    """Refuse (ValueError) anything that is not Qwen2.5-0.5B-Instruct's architecture.

    Checks the class, every architecture field of `QWEN_ARCH`, that the output
    projection *is* the input embedding (tied), and the number of unique
    trainable parameters (494,032,768).  Every mismatch is listed at once.
    """
    from transformers import Qwen2ForCausalLM

    problems = []
    if not isinstance(model, Qwen2ForCausalLM):
        problems.append(f"class is {type(model).__name__}, expected Qwen2ForCausalLM")
    else:
        for key, expected in QWEN_ARCH.items():
            got = _config_value(model.config, key)
            if got != expected:
                problems.append(f"config.{key} is {got!r}, expected {expected!r}")
        if model.lm_head.weight is not model.model.embed_tokens.weight:
            problems.append("lm_head.weight is not model.embed_tokens.weight (the embeddings must be tied)")
    count = count_unique_parameters(model)
    if count != QWEN_PARAMETERS:
        problems.append(f"{count:,} unique trainable parameters, expected {QWEN_PARAMETERS:,}")
    if problems:
        raise ValueError(
            f"not {QWEN_REPO_ID} at revision {QWEN_REVISION}: " + "; ".join(problems)
        )


def _hf_cache_snapshot() -> Path:
    """Where the Hugging Face cache keeps this revision (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache)."""
    hub = os.environ.get("HF_HUB_CACHE")
    if not hub:
        home = os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface"))
        hub = os.path.join(home, "hub")
    return Path(hub) / ("models--" + QWEN_REPO_ID.replace("/", "--")) / "snapshots" / QWEN_REVISION


def _missing_qwen_message(tried: list[tuple[str, Path, list[str]]]) -> str:
    lines = [f"the qwen preset needs {QWEN_REPO_ID} at revision {QWEN_REVISION} on disk (labkit never downloads):"]
    for source, folder, missing in tried:
        lines.append(f"  {source}: {folder} lacks {', '.join(missing)}")
    example = os.environ.get(QWEN_DIR_ENV) or "models/qwen2.5-0.5b-instruct"
    lines += [
        f"download the files {', '.join(QWEN_FILES)} with",
        f"  hf download {QWEN_REPO_ID} --revision {QWEN_REVISION} --local-dir {example}",
        f"then pass that folder (load('qwen', path=...)) or set {QWEN_DIR_ENV}={example};",
        f"a copy in the Hugging Face cache ({_hf_cache_snapshot()}) is found without either.",
    ]
    return "\n".join(lines)


def find_qwen_dir(path: str | os.PathLike | None = None) -> Path:
    """The local folder holding the qwen weights: `path`, else $LABKIT_QWEN_DIR, else the HF cache snapshot.

    An explicitly named folder (argument or environment) must be complete; the
    cache is only looked at when nothing is named.  Raises FileNotFoundError
    saying exactly what to download and where to put it.
    """
    if path is not None:
        candidates = [("path", Path(path))]
    elif os.environ.get(QWEN_DIR_ENV):
        candidates = [(f"${QWEN_DIR_ENV}", Path(os.environ[QWEN_DIR_ENV]))]
    else:
        candidates = [("Hugging Face cache", _hf_cache_snapshot())]
    tried = []
    for source, folder in candidates:
        missing = [f for f in QWEN_REQUIRED_FILES if not (folder / f).is_file()]
        if not missing:
            return folder
        tried.append((source, folder, missing))
    raise FileNotFoundError(_missing_qwen_message(tried))


def default_device(preset: str) -> str:
    """qwen: CUDA when present (the full protocol needs it); tiny: the CPU (its cache is made there)."""
    if preset == "qwen" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def disable_tf32() -> None:
    """FP32 means FP32: no TensorFloat-32 in matrix products or convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def load_qwen(path: str | os.PathLike | None = None, device: str | None = None):
    """(model, tokenizer) of Qwen2.5-0.5B-Instruct from disk, FP32, eager, TF32 off, checked."""
    from transformers import Qwen2ForCausalLM

    from transformers import AutoTokenizer

    folder = find_qwen_dir(path)
    check_qwen_config_file(folder / "config.json")  # before anything is built: another model's sizes could fill memory
    disable_tf32()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = Qwen2ForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager", local_files_only=True
    )
    check_qwen(model)
    return model.to(device or default_device("qwen")).eval(), tokenizer


# ---------------------------------------------------------------------------
# The tiny preset: the committed base, or any other state of the same model
# ---------------------------------------------------------------------------

TINY_BASE_DIR = REPO_ROOT / "runs" / "tiny" / "base"
TINY_BASE_STATE = TINY_BASE_DIR / "model.safetensors"


def load_tiny(state: str | os.PathLike | None = None, device: str | None = None):
    """(model, tokenizer) of the tiny preset: the committed base unless `state` names another file."""
    state = Path(state) if state is not None else TINY_BASE_STATE
    if not state.is_file():
        hint = "pretrain it with `python -m labkit pretrain --preset tiny`" if state == TINY_BASE_STATE else "check the path"
        raise FileNotFoundError(f"no tiny model state at {state}; {hint}")
    tokenizer = load_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):  # loading must not reseed the caller's generator
        model = new_tiny_model(seed=0, tokenizer=tokenizer)
    load_state_into(model, state)
    return model.to(device or default_device("tiny")).eval(), tokenizer


def load(preset: str, state: str | os.PathLike | None = None, device: str | None = None,
         path: str | os.PathLike | None = None):
    """(model, tokenizer) of a preset, FP32, eager attention, eval mode.

    tiny: the committed base (`runs/tiny/base/model.safetensors`) unless `state`
    names another safetensors file (a warm start, say).  qwen: the checked
    Qwen2.5-0.5B-Instruct weights from `path`, $LABKIT_QWEN_DIR or the HF cache,
    then optionally `state` (a safetensors file saved by `save_model`).
    `device` defaults to CUDA for qwen when present, else the CPU.
    """
    if preset == "tiny":
        if path is not None:
            raise ValueError(f"path={path!r} is for the qwen preset; the tiny preset takes state=")
        return load_tiny(state, device)
    if preset == "qwen":
        model, tokenizer = load_qwen(path, device)
        if state is not None:
            load_state_into(model, state)
        return model, tokenizer
    raise ValueError(f"unknown preset {preset!r}; expected 'tiny' or 'qwen'")


# ---------------------------------------------------------------------------
# safetensors save / load and parameter digests
# ---------------------------------------------------------------------------


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors to save: every state-dict entry once (a tied weight under its first name), on the CPU."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue  # lm_head.weight is embed_tokens.weight: safetensors refuses shared tensors
        seen.add(id(t))
        out[name] = t.detach().to("cpu").contiguous()
    return out


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors file with its JSON header written in sorted key order.

    The safetensors library builds the header from a hash map, so the order of the
    metadata keys can change from one process to the next: the same tensors gave
    files with different SHA-256 (a resume check compares those hashes).  Offsets
    into the data section are explicit, so re-ordering the header changes nothing
    else; the header is padded with spaces to a multiple of 8 bytes, as the format asks.
    """
    import json

    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def save_model(model: torch.nn.Module, path: str | os.PathLike) -> Path:
    """Write the model's unique tensors to a safetensors file, atomically (temp file + rename).

    The bytes depend only on the tensors: equal models give files with equal SHA-256.
    """
    from safetensors.torch import save

    data = save(unique_state(model), metadata={"format": "pt", "labkit_parameter_digest": parameter_digest(model)})
    return atomic_write_bytes(path, canonical_safetensors(data))


def load_state_into(model: torch.nn.Module, path: str | os.PathLike) -> torch.nn.Module:
    """Copy a `save_model` file into `model` in place (tying kept); refuses any name/shape/dtype mismatch."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no safetensors file at {path}")
    check_recorded_digest(path)  # the bytes its producing run recorded, before anything is read
    try:
        saved = load_file(str(path), device="cpu")
    except Exception as err:  # safetensors raises its own error type for a file that is not one of its own
        raise ValueError(f"{path} is not a safetensors model file ({type(err).__name__}: {err})") from None
    expected = unique_state(model)
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path} does not fit {type(model).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    targets = dict(model.state_dict(keep_vars=True))
    for name, tensor in saved.items():
        target = targets[name]
        if target.shape != tensor.shape or target.dtype != tensor.dtype:
            raise ValueError(
                f"{path}: {name} is {tuple(tensor.shape)} {tensor.dtype}, the model has {tuple(target.shape)} {target.dtype}"
            )
        with torch.no_grad():
            target.copy_(tensor)
    # Every file `save_model` wrote records the digest of what it saved: a flipped bit anywhere
    # in the tensors is caught here, at every load, before anything trains on or samples from it.
    recorded = recorded_digest(path)
    if recorded is not None and parameter_digest(model) != recorded:
        raise ValueError(f"{path}: its parameters hash to {parameter_digest(model)[:16]}..., the file records "
                         f"{recorded[:16]}...; the file was corrupted or changed after it was saved")
    return model


def recorded_digest(path: str | os.PathLike) -> str | None:
    """The parameter digest `save_model` recorded in a safetensors file's metadata, or None."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return (f.metadata() or {}).get("labkit_parameter_digest")


def parameter_digest(model: torch.nn.Module) -> str:
    """SHA-256 over the unique parameters' names, dtypes, shapes and raw bytes, in name order.

    Equal digests mean bitwise-equal weights; it proves a policy unchanged.
    """
    h = hashlib.sha256()
    for name, p in sorted(unique_parameters(model), key=lambda item: item[0]):
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
