"""What every run needs from its surroundings: seeds, deterministic kernels, digests, versions.

Used by SFT, GRPO, evaluation and the smoke run alike, so a reader finds each rule once:

    seed_everything(seed)        Python, NumPy and Torch global RNGs
    hashed_seed(key)             a 62-bit seed that is a pure function of a string (per-sample seeds)
    deterministic(device, ...)   torch.use_deterministic_algorithms inside a `with`, restored after
    code_digests()               SHA-256 of every labkit source file (recorded in manifests)
    data_digests(names)          SHA-256 of the named data files
    environment(device)          Python, torch, transformers, device, threads (and CUDA facts)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import random

import numpy as np
import torch

from .runs import REPO_ROOT, sha256_file

SEED_BITS = 62
DATA_DIR = REPO_ROOT / "data" / "stock_arithmetic_v1"
# The data files a training run reads (the test split is never read by learning).
LEARNING_DATA_FILES = ("train.statements.jsonl", "train.labels.jsonl",
                       "validation.statements.jsonl", "validation.labels.jsonl")


def hashed_seed(key: str) -> int:
    """The first 8 bytes of SHA-256(key), big-endian, shifted right by 64 - SEED_BITS = 2 bits.

    A pure function of the string: no generator state, no order of work, nothing a policy could
    change.  Evaluation ("eval/<id>/<draw>"), the learned verifier's data and the format base's
    measurements each name their samples under their own prefix."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") >> (64 - SEED_BITS)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and Torch's (CPU and CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@contextlib.contextmanager
def deterministic(device: str = "cpu", *, warn_only: bool = False):
    """`torch.use_deterministic_algorithms(True)` inside, the caller's setting restored after.

    Training uses `warn_only=False`: an op without a deterministic kernel is an error, since
    exact resume depends on it.  Evaluation only reads the model, so it uses `warn_only=True`:
    such an op must not abort minutes of generation (its manifest says so)."""
    previous = torch.are_deterministic_algorithms_enabled()
    previous_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if device.startswith("cuda") or torch.cuda.is_available():
        # cuBLAS needs a fixed workspace to be deterministic; it is read at its first use
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn)


def code_digests() -> dict[str, str]:
    """SHA-256 of every labkit source file, by path relative to the repository."""
    root = REPO_ROOT / "labkit"
    return {str(p.relative_to(REPO_ROOT)): sha256_file(p) for p in sorted(root.rglob("*.py"))}


def data_digests(names: tuple[str, ...] = LEARNING_DATA_FILES) -> dict[str, str]:
    """SHA-256 of the named files of the data folder."""
    return {name: sha256_file(DATA_DIR / name) for name in names}


def environment(device: str) -> dict:
    """The versions and settings that a run's numbers depend on."""
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": True,
    }
    if device.startswith("cuda"):
        env.update(
            cuda=torch.version.cuda,
            gpu=torch.cuda.get_device_name(device),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            tf32_cudnn=torch.backends.cudnn.allow_tf32,
        )
    return env
