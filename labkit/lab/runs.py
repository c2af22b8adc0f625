"""Run folders, manifests, atomic writes and digests.

A finished run is evidence: it is never overwritten.  Every artifact is written
to a temporary file in the same folder and renamed into place, so a writer
killed mid-way leaves the previous file intact and readable.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import threading
import tempfile
import zlib
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

REPO_ROOT = Path(__file__).resolve().parents[2]
FINISHED_MARKER = "FINISHED"


def sync_folder(folder: str | os.PathLike) -> None:
    """fsync a folder, so that a rename into it survives a power cut (a no-op where the OS cannot)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to sync a folder; the rename itself is still atomic
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike):
    """A binary file to write into; on success it is synced and renamed to `path` (and the folder
    synced), on any error removed, so `path` is either its old self or complete.

        with atomic_writer("runs/x/model.bin") as f:
            f.write(b"...")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; artifacts are meant to be read by others
        os.replace(tmp, path)
        sync_folder(path.parent)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno and not isinstance(err.filename, str):
            # a failed write names no file (or its descriptor): name the one being written
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` via a temporary file + fsync + rename + folder fsync (atomic on POSIX)."""
    with atomic_writer(path) as f:
        f.write(data)
    return Path(path)


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


def display_path(path: str | os.PathLike) -> str:
    """A repository-relative path when inside the repository (stable across clones), else absolute."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def preset_folder(preset: str, *names: str) -> Path:
    """runs/<preset>/<names...>: where every run folder of a preset lives (the cache's steps are these
    folders).  The one constructor of the default run folders: the modules' `default_run_dir`s name
    their step here."""
    return REPO_ROOT.joinpath("runs", preset, *names)


def run_path(run_dir: str | os.PathLike) -> Path:
    """The run folder as an absolute path with `..` resolved lexically.

    `runs/tiny/grpo/states/..` names runs/tiny/grpo even where states/ does not exist
    (a fresh clone): the operating system would resolve it only through a folder that exists.
    """
    return Path(os.path.normpath(os.path.abspath(run_dir)))


# -- One writer per run folder ---------------------------------------------------------------------
#
# Two processes writing one run folder would delete each other's parts and states.  A writer holds
# an OS lock (`fcntl.flock`) on the folder's `.lock` file for as long as it writes; the kernel
# releases it when the process ends, however it ends, so a killed writer never leaves a folder
# locked.  A folder reached through a link is the same folder (the lock file is the same file).
# Within one process the lock is re-entrant: a notebook or a test may run into the same folder again.

LOCK_FILE = ".lock"
_HELD: dict[str, tuple[int, int]] = {}  # real folder path -> (the open lock file's descriptor, the holding thread)


class RunFolderError(RuntimeError):
    """A run folder cannot be written as asked (the message says why and what to do)."""


class RunFolderBusyError(RunFolderError):
    """Another process is writing into the run folder."""


class UnfinishedRunError(RunFolderError):
    """The run folder holds an earlier, unfinished attempt, and neither resume nor restart was asked for."""


def hold_folder(folder: str | os.PathLike) -> None:
    """Take the folder's writer lock, or raise RunFolderBusyError naming the folder and the holder's pid."""
    real = os.path.realpath(folder)
    if fcntl is None:  # no fcntl (Windows): one writer per folder is then the user's care
        return
    if real in _HELD:
        # the thread that holds it may take it again (a run's own steps); another thread of this process (a Dask
        # worker runs its tasks in threads) may not, or two writers would share one folder
        if _HELD[real][1] == threading.get_ident():
            return
        raise RunFolderBusyError(f"{display_path(folder)} is being written by another thread of this process (pid "
                                 f"{os.getpid()}); wait for it to end, or choose another folder")
    fd = os.open(os.path.join(real, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderBusyError(f"{display_path(folder)} is being written by another process (pid {holder}); "
                                 "wait for it to end, or choose another folder") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    _HELD[real] = (fd, threading.get_ident())


def release_folder(folder: str | os.PathLike) -> None:
    held = _HELD.pop(os.path.realpath(folder), None)
    if held is not None:
        os.close(held[0])  # closing the file releases the flock


def same_folder(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Do two spellings (links, `..`, relative) name one folder?"""
    a, b = os.path.realpath(a), os.path.realpath(b)
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# -- A run folder ----------------------------------------------------------------------------------
#
# A run folder holds three kinds of file:
#   whole files   written once, atomically (model.safetensors, history.json, manifest.json, states);
#   parts         JSON Lines files that grow by one block per iteration (rollouts, timings), so a
#                 kill loses no finished iteration's rows;
#   FINISHED      written last: a folder without it is an unfinished attempt.
# The folder's ledger, `parts.json`, lists every part with its row count, size and SHA-256, and
# every whole file registered with its digest.  Readers go by the ledger (and, once the run is
# finished, by the manifest's copy of it), never by globbing: a file the ledger does not list is
# not part of the run.

LEDGER_FILE = "parts.json"
MANIFEST_FILE = "manifest.json"


class RunFolder:
    """One run folder: its paths, its ledger of parts and files, its FINISHED marker.

    folder = RunFolder("runs/tiny/grpo")
    folder.open_for_writing(overwrite=False)  # refuses a finished run
    folder.append("rollouts.jsonl.gz", rows)   # one block, flushed and synced, ledger updated
    folder.read_part("rollouts.jsonl.gz")      # checked against the ledger's rows and digest
    """

    def __init__(self, path: str | os.PathLike):
        self.path = run_path(path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def real(self) -> Path:
        """The folder with symbolic links resolved: a link to a finished run is that finished run."""
        return Path(os.path.realpath(self.path))

    @property
    def states(self) -> Path:
        return self.path / "states"

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_FILE

    # -- finished or not

    def is_finished(self) -> bool:
        return (self.path / FINISHED_MARKER).exists() or (self.real / FINISHED_MARKER).exists()

    def open_for_writing(self, overwrite: bool = False) -> "RunFolder":
        """Refuse a finished run unless `overwrite`; create the folder and hold its lock (`hold_folder`).
        An overwrite un-finishes it first."""
        if self.is_finished() and not overwrite:
            raise RunExistsError(
                f"{self.path} holds a finished run, which is evidence and is never overwritten; "
                "choose a new folder or pass --overwrite explicitly"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        hold_folder(self.path)
        (self.path / FINISHED_MARKER).unlink(missing_ok=True)  # an overwrite un-finishes the run first
        return self

    def release(self) -> None:
        """Let other processes write here again (the kernel does it anyway when this one ends)."""
        release_folder(self.path)

    def mark_finished(self, summary: dict | None = None) -> None:
        """Write FINISHED (last: a folder without it is an unfinished attempt); the writer is done, so its
        lock is released."""
        summary = dict(summary or {})
        if self.manifest_path.is_file():  # the manifest is checked against this digest whenever it is read
            summary["manifest_sha256"] = sha256_file(self.manifest_path)
        atomic_write_text(self.path / FINISHED_MARKER, dumps_json(summary))
        self.release()

    def manifest(self) -> dict:
        check_manifest(self.path)
        if not self.manifest_path.is_file():
            raise ArtifactError(f"{self.manifest_path} is missing: {self.path} is not a finished run")
        return read_json(self.manifest_path)

    def clear(self, patterns: tuple[str, ...]) -> list[Path]:
        """Remove what an earlier attempt left: the files matching `patterns` (relative globs), the
        ledger, every temporary of a killed write, FINISHED.  Returns what it removed.

        Cleanup is the one place that globs: it must find what no ledger lists any more."""
        doomed = {p for pattern in (*patterns, LEDGER_FILE, FINISHED_MARKER, ".*.tmp", "states/.*.tmp")
                  for p in self.path.glob(pattern) if p.is_file()}
        for path in sorted(doomed):
            path.unlink()
        return sorted(doomed)

    # -- the ledger

    def ledger(self) -> dict:
        """{"parts": {name: {"rows", "bytes", "sha256"}}, "files": {name: {"bytes", "sha256"}}}.

        A finished run's ledger is the copy in its manifest; an unfinished one's is parts.json."""
        if self.is_finished():
            manifest = self.manifest()
            if "ledger" not in manifest:
                raise ArtifactError(f"{self.manifest_path} lists no parts (a run written before ledgers existed); "
                                    "rebuild it with `make cache`")
            return manifest["ledger"]
        path = self.path / LEDGER_FILE
        return read_json(path) if path.is_file() else {"parts": {}, "files": {}}

    def _write_ledger(self, ledger: dict) -> None:
        write_json(self.path / LEDGER_FILE, ledger)

    def register(self, name: str, sha256: str | None = None) -> dict:
        """Record a whole file (relative name) with its size and digest in the ledger."""
        path = self.path / name
        entry = {"bytes": path.stat().st_size, "sha256": sha256 or sha256_file(path)}
        ledger = self.ledger()
        ledger["files"][name] = entry
        self._write_ledger(ledger)
        return entry

    def forget(self, name: str) -> None:
        """Remove a registered whole file (relative name) and its ledger entry."""
        ledger = self.ledger()
        ledger["files"].pop(name, None)
        self._write_ledger(ledger)
        (self.path / name).unlink(missing_ok=True)

    def check_file(self, name: str) -> None:
        """Refuse a registered file whose bytes no longer have the digest the ledger recorded."""
        entry = self.ledger()["files"].get(name)
        if entry is None:
            return
        actual = sha256_file(self.path / name)
        if actual != entry["sha256"]:
            raise ArtifactError(f"{self.path / name} has SHA-256 {actual[:16]}..., but {self.path.name}'s ledger "
                                f"recorded {entry['sha256'][:16]}...; the file was changed or damaged "
                                "(rebuild the run, e.g. with `make cache`)")

    # -- parts: files that grow by one block per iteration

    def append(self, name: str, rows: list[dict]) -> dict:
        """Append `rows` as one block to the part `name`, flush and fsync it, then update the ledger.

        A `.gz` part grows by one gzip member per block (a multi-member file is ordinary gzip), so
        truncating it at a recorded size leaves a complete, readable file."""
        data = jsonl_bytes(rows)
        if name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=6, mtime=0)
        ledger = self.ledger()
        before = ledger["parts"].get(name, {"rows": 0, "bytes": 0})
        path = self.path / name
        try:
            with open(path, "r+b" if path.exists() else "wb") as f:
                f.truncate(before["bytes"])  # anything past the ledger is a killed write's tail
                f.seek(before["bytes"])
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            if err.errno and not isinstance(err.filename, str):  # a failed write names no file: name it
                raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None
            raise
        entry = {"rows": before["rows"] + len(rows), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        ledger["parts"][name] = entry
        self._write_ledger(ledger)
        return entry

    def restore(self, ledger: dict) -> list[str]:
        """Return the folder to an earlier `ledger` (a state's copy): cut every part back to its
        recorded size and check its digest; remove parts the ledger does not list.  Returns the
        names cut or removed."""
        changed = []
        current = self.ledger()
        for name in sorted(set(current["parts"]) - set(ledger["parts"])):
            (self.path / name).unlink(missing_ok=True)
            changed.append(name)
        for name, entry in sorted(ledger["parts"].items()):
            path = self.path / name
            size = path.stat().st_size if path.exists() else None
            if size is None or size < entry["bytes"]:
                raise ArtifactError(f"{path} holds {size or 0} bytes, but the state records {entry['bytes']}: "
                                    "rows the state counts as written are missing; start the run afresh")
            if size > entry["bytes"]:
                with open(path, "r+b") as f:
                    f.truncate(entry["bytes"])
                    os.fsync(f.fileno())
                changed.append(name)
            actual = sha256_file(path)
            if actual != entry["sha256"]:
                raise ArtifactError(f"{path} has SHA-256 {actual[:16]}... where the state records "
                                    f"{entry['sha256'][:16]}...; its rows were changed or damaged since; "
                                    "start the run afresh")
        files = {name: entry for name, entry in current["files"].items() if (self.path / name).exists()}
        self._write_ledger({"parts": dict(ledger["parts"]), "files": files})
        return changed

    def read_part(self, name: str) -> list[dict]:
        """The rows of part `name`, after checking its size, digest and row count against the ledger."""
        entry = self.ledger()["parts"].get(name)
        path = self.path / name
        if entry is None:
            raise ArtifactError(f"{self.path}: its ledger lists no part {name!r}")
        if not path.is_file():
            raise ArtifactError(f"{path} is missing, but the ledger lists it with {entry['rows']} rows")
        actual = sha256_file(path)
        if actual != entry["sha256"]:
            raise ArtifactError(f"{path} has SHA-256 {actual[:16]}..., but the ledger recorded "
                                f"{entry['sha256'][:16]}...: the file was changed, damaged or is mid-write")
        rows = read_jsonl(path)
        if len(rows) != entry["rows"]:
            raise ArtifactError(f"{path} holds {len(rows)} rows, but the ledger records {entry['rows']}")
        return rows


# The command that rebuilds what a run folder of runs/<preset>/ holds, for the refusal's message.
REBUILD_COMMANDS = {"base": "pretrain", "warm_start": "warm-start", "sft": "sft", "grpo": "grpo",
                    "grpo_g2": "group-size", "grpo_g8": "group-size", "reward_model": "reward-model",
                    "format_base": "format-base"}


def check_manifest(run_dir: str | os.PathLike) -> None:
    """Refuse a finished run whose manifest.json is missing, or differs from the digest its FINISHED
    marker recorded (an edited or damaged manifest would vouch for the wrong files)."""
    folder = run_path(run_dir)
    finished = folder / FINISHED_MARKER
    if not finished.is_file():
        return
    try:
        expected = json.loads(finished.read_text(encoding="utf-8")).get("manifest_sha256")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        raise ArtifactError(f"{finished} is damaged (not the JSON object the lab writes); rebuild the run") from None
    if expected is None:  # a run finished before FINISHED recorded its manifest
        return
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        raise ArtifactError(f"{manifest} is missing, but {finished} says the run finished with one; "
                            "rebuild the run (e.g. with `make cache`)")
    actual = sha256_file(manifest)
    if actual != expected:
        raise ArtifactError(f"{manifest} has SHA-256 {actual[:16]}..., but {finished} recorded {expected[:16]}...: "
                            "the manifest was edited or damaged since the run finished; rebuild the run "
                            "(e.g. with `make cache`)")


def recorded_sha256(path: str | os.PathLike) -> tuple[str, Path] | None:
    """(digest, where it is recorded) for a file its run folder records, or None.

    A file is recorded by the ledger of its folder (parts.json while the run is unfinished, the
    manifest's copy once it is finished), by a manifest's `files`, or (the base) `model_sha256`.
    States live in <run>/states/, so their folder is the one above."""
    path = run_path(path)
    owner = path.parent.parent if path.parent.name == "states" else path.parent
    name = str(path.relative_to(owner))
    check_manifest(owner)
    for record in (owner / LEDGER_FILE, owner / MANIFEST_FILE):
        if not record.is_file():
            continue
        listing = read_json(record)
        if not isinstance(listing, dict):
            continue
        ledger = listing.get("ledger", listing) if record.name == MANIFEST_FILE else listing
        files = listing.get("files", {}) if isinstance(listing.get("files"), dict) else {}
        for entry in (ledger.get("files", {}).get(name), files.get(name),
                      files.get("states", {}).get(name) if isinstance(files.get("states"), dict) else None):
            if isinstance(entry, dict) and "sha256" in entry:
                return entry["sha256"], record
        if name == "model.safetensors" and isinstance(listing.get("model_sha256"), str):
            return listing["model_sha256"], record
    return None


def read_checked_json(path: str | os.PathLike):
    """A run file's JSON, refused in one line naming the file when its bytes differ from the SHA-256 its run
    folder records (`recorded_sha256`), or when it holds NaN or an infinity (Python's json reads them; no
    file of the lab holds one).  For readers of finished runs: results pages, the sweep's collector."""
    path = Path(path)
    recorded = recorded_sha256(path)
    if recorded is not None:
        actual = sha256_file(path)
        if actual != recorded[0]:
            raise ArtifactError(f"{display_path(path)} has SHA-256 {actual[:12]}..., but {display_path(recorded[1])} "
                                f"records {recorded[0][:12]}...: restore the file (git checkout -- FILE) or rebuild "
                                "its run")

    def refuse(constant: str):
        raise ArtifactError(f"{display_path(path)} holds {constant}: every number of a lab file is finite")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def check_recorded_digest(path: str | os.PathLike) -> None:
    """Refuse a model or state whose bytes differ from the digest its producing run recorded.

    The message names the file, both digests and the command that rebuilds it."""
    found = recorded_sha256(path)
    if found is None:
        return
    expected, record = found
    actual = sha256_file(path)
    if actual != expected:
        folder = record.parent
        command = REBUILD_COMMANDS.get(folder.name)
        preset = folder.parent.name
        how = (f"rebuild it with `python -m labkit {command} --preset {preset} --overwrite` (or `make cache`)"
               if command else "rebuild the run that made it")
        raise ArtifactError(f"{path} has SHA-256 {actual}, but {record} records {expected}: "
                            f"the file was changed or damaged since it was written; {how}")


def is_finished(run_dir: str | os.PathLike) -> bool:
    return RunFolder(run_dir).is_finished()


def ensure_not_finished(run_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse to write into a finished run unless `overwrite` is explicitly set (then un-finish it)."""
    return RunFolder(run_dir).open_for_writing(overwrite).path


def hold_for_replacing(run_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Like `ensure_not_finished`, for a writer that replaces a finished result only at its very end: the
    folder is created and locked, and a finished run (with `overwrite`) keeps its FINISHED until the caller
    writes the new files, so that an overwrite stopped before then leaves the old result finished."""
    folder = RunFolder(run_dir)
    if folder.is_finished() and not overwrite:
        folder.open_for_writing(False)  # refuses, in the same words as every writer
    folder.path.mkdir(parents=True, exist_ok=True)
    hold_folder(folder.path)
    return folder.path


def mark_finished(run_dir: str | os.PathLike, summary: dict | None = None) -> None:
    RunFolder(run_dir).mark_finished(summary)
