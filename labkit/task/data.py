"""The committed StockArithmetic-v1 files and phase separation.

Statements (what a model may see) and labels (structure and target) are stored
in separate files.  Every read goes through `open_records`, which knows the
phase of the caller and refuses what that phase may not see:

    phase       statements            labels           inference outputs
    learning    train, validation     train, validation  never
    inference   all splits            never              its own
    scoring     all                   all                all

The rule is enforced here, in code, not by convention: every reader names its phase (there is
no default), and an inference output is recognised by the manifest of the folder that holds it
(`"phase": "inference"`), wherever it was copied, as well as by the folder names evaluation/ and
predictions/.  Every file read is checked against the digests in SHA256SUMS, written with the data.
"""

from __future__ import annotations

from pathlib import Path

from ..lab.runs import REPO_ROOT, ArtifactError, atomic_write_text, read_json, read_jsonl, sha256_file, write_jsonl
from . import problems

DATA_DIR = REPO_ROOT / "data" / "stock_arithmetic_v1"
SPLITS = ("train", "validation", "test")
KINDS = ("statements", "labels")
PHASES = ("learning", "inference", "scoring")
# Any file under a folder with one of these names holds inference outputs; so does any file under
# a folder whose manifest.json says "phase": "inference" (what labkit.eval.evaluate writes).
INFERENCE_OUTPUT_DIRS = ("predictions", "evaluation")
INFERENCE_PHASE_MARK = {"phase": "inference"}
DIGESTS_FILE = "SHA256SUMS"


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


def is_inference_output(path: str | Path) -> bool:
    """True for a file under an evaluation/ or predictions/ folder, or under any folder whose
    manifest.json records `"phase": "inference"` (so a copied predictions folder is still one)."""
    resolved = Path(path).resolve()
    if set(resolved.parts).intersection(INFERENCE_OUTPUT_DIRS):
        return True
    for folder in resolved.parents:
        manifest = folder / "manifest.json"
        if manifest.is_file():
            try:
                content = read_json(manifest)
            except ArtifactError:
                continue
            if isinstance(content, dict) and content.get("phase") == INFERENCE_PHASE_MARK["phase"]:
                return True
    return False


def check_path_access(phase: str, path: str | Path) -> None:
    """Learning may not open inference outputs (see `is_inference_output`)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    if phase == "learning" and is_inference_output(path):
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
    check_digest(path)
    return read_jsonl(path)


def recorded_digests(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """{file name: SHA-256} from the data folder's SHA256SUMS (the `sha256sum` format)."""
    path = Path(data_dir) / DIGESTS_FILE
    if not path.is_file():
        raise ArtifactError(f"{path} is missing; regenerate the data with `python -m labkit data`")
    digests = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        digests[name] = digest
    return digests


def check_digest(path: Path) -> None:
    """Refuse a data file whose bytes differ from SHA256SUMS (a flipped bit, a hand edit)."""
    expected = recorded_digests(path.parent).get(path.name)
    actual = sha256_file(path)
    if actual != expected:
        raise ArtifactError(f"{path} has SHA-256 {actual}, but {path.parent / DIGESTS_FILE} records {expected}: "
                            "the file was changed or damaged; restore it with `git checkout` or regenerate "
                            "the data with `python -m labkit data`")


def split_records(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Separate full records into statement rows and label rows per split."""
    out: dict[tuple[str, str], list[dict]] = {(k, s): [] for k in KINDS for s in SPLITS}
    for r in records:
        base = {"id": r["id"], "split": r["split"], "population": r["population"]}
        out[("statements", r["split"])].append({**base, "statement": r["statement"]})
        out[("labels", r["split"])].append({**base, "problem": r["problem"], "target": r["target"]})
    return out


def write_dataset(data_dir: Path = DATA_DIR, seed: int = problems.DEFAULT_SEED) -> list[Path]:
    """Generate the dataset from `seed` and write the six files; returns their paths."""
    paths = []
    for (kind, split), rows in split_records(problems.generate_dataset(seed)).items():
        paths.append(write_jsonl(Path(data_dir) / file_name(kind, split), rows))
    atomic_write_text(Path(data_dir) / DIGESTS_FILE,
                      "".join(f"{sha256_file(p)}  {p.name}\n" for p in sorted(paths)))
    return paths


def joined(split: str, *, phase: str, data_dir: Path = DATA_DIR) -> list[dict]:
    """Statements joined with labels by id.  The caller names its phase: learning gets train and
    validation only, inference none (labels), scoring everything."""
    statements = open_records("statements", split, phase, data_dir)
    labels = {r["id"]: r for r in open_records("labels", split, phase, data_dir)}
    unlabelled = [s["id"] for s in statements if s["id"] not in labels]
    if unlabelled or len(labels) != len(statements):
        folder = Path(data_dir)
        raise ArtifactError(
            f"{folder / file_name('statements', split)} and {folder / file_name('labels', split)} do not hold the "
            f"same problems ({len(statements)} statements, {len(labels)} labels; unlabelled ids: "
            f"{unlabelled[:3]}{' ...' if len(unlabelled) > 3 else ''}): every statement needs the label of its id; "
            "regenerate the data with `python -m labkit data`")
    return [{**s, **labels[s["id"]]} for s in statements]
