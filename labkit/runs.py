"""Run folders, manifests, atomic writes and digests.

A finished run is evidence: it is never overwritten.  Every artifact is written
to a temporary file in the same folder and renamed into place, so a writer
killed mid-way leaves the previous file intact and readable.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FINISHED_MARKER = "FINISHED"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` via a temporary file + fsync + rename (atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; artifacts are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def dumps_json(obj) -> str:
    """Deterministic JSON: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, dumps_json(obj))


class ArtifactError(ValueError):
    """A run's file is missing, truncated or not what it should be (the message names the file)."""


def read_json(path: str | os.PathLike):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                            "it may be truncated or hand-edited") from None


def jsonl_bytes(rows) -> bytes:
    """One compact JSON object per line, keys in insertion order, UTF-8."""
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows).encode("utf-8")


def write_jsonl(path: str | os.PathLike, rows) -> Path:
    """Write JSON Lines; a `.gz` suffix writes gzip (level 6, mtime 0 so bytes are reproducible)."""
    data = jsonl_bytes(rows)
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    return atomic_write_bytes(path, data)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    rows.append(json.loads(line))
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path}: line {number} is not valid JSON ({err.msg}); the file may be truncated") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise ArtifactError(f"{path} is not a complete gzip file ({err}); it may be truncated") from None
    return rows


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class RunExistsError(FileExistsError):
    """Raised when a command would overwrite a finished run."""


def run_path(run_dir: str | os.PathLike) -> Path:
    """The run folder as an absolute path with `..` resolved lexically.

    `runs/tiny/grpo/states/..` names runs/tiny/grpo even where states/ does not exist
    (a fresh clone): the operating system would resolve it only through a folder that exists.
    """
    return Path(os.path.normpath(os.path.abspath(run_dir)))


def is_finished(run_dir: str | os.PathLike) -> bool:
    return (run_path(run_dir) / FINISHED_MARKER).exists()


def ensure_not_finished(run_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse to write into a finished run unless `overwrite` is explicitly set."""
    run_dir = run_path(run_dir)
    if is_finished(run_dir) and not overwrite:
        raise RunExistsError(
            f"{run_dir} holds a finished run, which is evidence and is never overwritten; "
            "choose a new folder or pass --overwrite explicitly"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def mark_finished(run_dir: str | os.PathLike, summary: dict | None = None) -> None:
    atomic_write_text(Path(run_dir) / FINISHED_MARKER, dumps_json(summary or {}))
