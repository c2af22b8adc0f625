"""The committed StockArithmetic-v1 files and phase separation.

Statements (what a model may see) and labels (structure and target) are stored
in separate files.  Every read goes through `open_records`, which knows the
phase of the caller and refuses what that phase may not see:

    phase       statements            labels           inference outputs
    learning    train, validation     train, validation  never
    inference   all splits            never              its own
    scoring     all                   all                all

The rule is enforced here, in code, not by convention.
"""

from __future__ import annotations

from pathlib import Path

from . import task
from .runs import REPO_ROOT, read_jsonl, write_jsonl

DATA_DIR = REPO_ROOT / "data" / "stock_arithmetic_v1"
SPLITS = ("train", "validation", "test")
KINDS = ("statements", "labels")
PHASES = ("learning", "inference", "scoring")
# Any file under a folder with one of these names holds inference outputs.
INFERENCE_OUTPUT_DIRS = ("predictions", "evaluation")


class PhaseError(PermissionError):
    """A phase asked for data it must not see."""


def file_name(kind: str, split: str) -> str:
    return f"{split}.{kind}.jsonl"


def check_access(phase: str, kind: str, split: str) -> None:
    """Raise PhaseError if `phase` may not open `kind` of `split`; ValueError on unknown names."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if phase == "learning" and split == "test":
        raise PhaseError(
            f"learning may not open test {kind}: the test split is held out until the final "
            "policies are fixed, so nothing learned can depend on it"
        )
    if phase == "inference" and kind == "labels":
        raise PhaseError(
            f"inference may not open {split} labels: predictions are made from statements only "
            "and joined with labels afterwards by the scoring phase"
        )


def check_path_access(phase: str, path: str | Path) -> None:
    """Learning may not open inference outputs (anything under a predictions/evaluation folder)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    parts = set(Path(path).resolve().parts)
    if phase == "learning" and parts.intersection(INFERENCE_OUTPUT_DIRS):
        raise PhaseError(
            f"learning may not open {path}: it is an inference output, and test responses never "
            "enter updates"
        )


def open_records(kind: str, split: str, phase: str, data_dir: Path = DATA_DIR) -> list[dict]:
    """Read one committed file after checking that `phase` may see it."""
    check_access(phase, kind, split)
    path = Path(data_dir) / file_name(kind, split)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; regenerate the data with `python -m labkit data`")
    return read_jsonl(path)


def split_records(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Separate full records into statement rows and label rows per split."""
    out: dict[tuple[str, str], list[dict]] = {(k, s): [] for k in KINDS for s in SPLITS}
    for r in records:
        base = {"id": r["id"], "split": r["split"], "population": r["population"]}
        out[("statements", r["split"])].append({**base, "statement": r["statement"]})
        out[("labels", r["split"])].append({**base, "problem": r["problem"], "target": r["target"]})
    return out


def write_dataset(data_dir: Path = DATA_DIR, seed: int = task.DEFAULT_SEED) -> list[Path]:
    """Generate the dataset from `seed` and write the six files; returns their paths."""
    paths = []
    for (kind, split), rows in split_records(task.generate_dataset(seed)).items():
        paths.append(write_jsonl(Path(data_dir) / file_name(kind, split), rows))
    return paths


def joined(split: str, data_dir: Path = DATA_DIR) -> list[dict]:
    """Statements joined with labels by id (scoring phase only)."""
    statements = open_records("statements", split, "scoring", data_dir)
    labels = {r["id"]: r for r in open_records("labels", split, "scoring", data_dir)}
    return [{**s, **labels[s["id"]]} for s in statements]
