"""The cached tiny run: what made each step, and whether it is stale.

The notebooks and CI read the committed tiny run under `runs/tiny/`.  Each step of it was made by
some code, some files (the data, a tokenizer) and the outputs of earlier steps.
`runs/<preset>/cache.json` records, for every step,

    "code":  the fingerprint of what its code does (`labkit.lab.fingerprint`): for every definition
             its entry points reach, a digest of the definition without docstrings, comments or layout;
    "files": the SHA-256 of every other input, upstream run files included (so a rebuilt step makes
             everything built from it stale too).

`check` recomputes both: a step is stale when a definition it reaches now does something else (or it
reaches another set of them), or when a file changed, and the verdict names each.  A comment, a
docstring, a re-wrapped line or a function no step reaches changes no verdict.  A step whose own files
differ from what their manifests record is "damaged", naming the files: they are restored, not rebuilt,
and the steps built from them are not called stale for it.

Which steps exist and what each one runs is not known here: the step graph is `labkit.steps`, at the
top of the package, and every function below takes the steps it works on.
`python -m labkit cache check` prints the verdicts; `make cache` rebuilds the stale steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .fingerprint import Sources, changed, git_show
from .runs import (FINISHED_MARKER, MANIFEST_FILE, REPO_ROOT, ArtifactError, check_manifest, is_finished, preset_folder,
                   read_json, sha256_bytes, sha256_file, write_json)

CACHE_FILE = "cache.json"


@dataclass(frozen=True)
class CacheStep:
    """One step of the protocol: its folder under runs/<preset>/, the code it runs and its other inputs."""

    name: str
    folder: str
    entries: tuple[str, ...]  # the functions that build it, "labkit.grpo.loop:run_grpo"
    files: tuple[str, ...] = ()  # other inputs in the repository (data, assets), by path
    upstream: tuple[str, ...] = ()  # files of earlier steps, relative to runs/<preset>/
    done_file: str | None = None  # the file that says the step is built (default: the folder's FINISHED marker)
    outputs: tuple[str, ...] = ()  # other files or folders of runs/<preset>/ the step writes (rebuilt with it)
    then: tuple[str, ...] = ()  # later steps that write into this step's output, so are rebuilt with it
    unrecorded: tuple[str, ...] = ()  # modules whose definitions its fingerprint leaves out (say why where the step is listed)

    def is_built(self, preset: str) -> bool:
        folder = runs_dir(preset) / self.folder
        return (folder / self.done_file).is_file() if self.done_file else is_finished(folder)


def _step_named(steps: tuple[CacheStep, ...], name: str) -> CacheStep:
    for s in steps:
        if s.name == name:
            return s
    raise ValueError(f"unknown step {name!r}; expected one of {tuple(s.name for s in steps)}")


def runs_dir(preset: str) -> Path:
    return preset_folder(preset)


def code_fingerprint(step: CacheStep, sources: Sources) -> dict[str, str]:
    """{"module:symbol": digest} of what `step` runs, in `sources` (its `unrecorded` modules left out)."""
    table = sources.fingerprint(list(step.entries))
    return {k: v for k, v in table.items() if k.partition(":")[0] not in step.unrecorded}


def file_digests(step: CacheStep, preset: str, code_root: Path = REPO_ROOT) -> dict[str, str | None]:
    """SHA-256 of every file input of `step` now (None for a missing file)."""
    out = {}
    for rel in step.files:
        path = Path(code_root) / rel
        out[rel] = sha256_file(path) if path.exists() else None
    for rel in step.upstream:
        path = runs_dir(preset) / rel
        out[f"runs/{preset}/{rel}"] = sha256_file(path) if path.exists() else None
    return out


def inputs(step: CacheStep, preset: str, sources: Sources | None = None, code_root: Path = REPO_ROOT) -> dict:
    """{"code": fingerprint, "files": digests}: what `check` compares with the record."""
    sources = sources if sources is not None else Sources.in_folder(code_root)
    return {"code": code_fingerprint(step, sources), "files": file_digests(step, preset, code_root)}


def read_cache(preset: str) -> dict:
    path = runs_dir(preset) / CACHE_FILE
    return read_json(path) if path.exists() else {}


def record(step: CacheStep, preset: str = "tiny") -> dict:
    """Record the inputs of a freshly built step in runs/<preset>/cache.json."""
    cache = read_cache(preset)
    cache[step.name] = inputs(step, preset)
    write_json(runs_dir(preset) / CACHE_FILE, cache)
    return cache[step.name]


def is_byte_record(entry: dict) -> bool:
    """An entry of the cache's first form: {path: SHA-256} of every file the step imported."""
    return "code" not in entry


def damaged_files(step: CacheStep, preset: str) -> list[str]:
    """The files of `step`'s finished runs that differ from the SHA-256 their run's manifest records (a
    manifest that differs from its FINISHED marker's record included), as "runs/<preset>/..."; a local
    file that is absent (a model a clone does not have) is not damaged."""
    root = runs_dir(preset)
    return [f"runs/{preset}/{path.relative_to(root)}"  # as `file_digests` names them
            for rel in (step.folder, *step.outputs) for path in damaged_in(root / rel)]


def damaged_in(top: Path) -> list[Path]:
    """The files of the finished runs in folder `top` and below that differ from the SHA-256 their run's
    manifest records, and the manifests that differ from their FINISHED marker's record; a file that is
    absent (a model a clone does not have) is not damaged.  [] where `top` is not a folder."""
    out = []
    if not top.is_dir():
        return out
    for marker in sorted(top.rglob(FINISHED_MARKER)):
        folder = marker.parent
        try:
            check_manifest(folder)
        except ArtifactError:
            out.append(folder / MANIFEST_FILE)
            continue
        if not (folder / MANIFEST_FILE).is_file():
            continue
        ledger = read_json(folder / MANIFEST_FILE).get("ledger", {})
        for name, entry in sorted({**ledger.get("parts", {}), **ledger.get("files", {})}.items()):
            path = folder / name
            if path.is_file() and sha256_file(path) != entry["sha256"]:
                out.append(path)
    return out


def check(steps: tuple[CacheStep, ...], preset: str = "tiny", code_root: Path = REPO_ROOT) -> dict[str, dict]:
    """Per step: {"status": "fresh" | "stale" | "damaged" | "missing" | "unrecorded", "changed": [what]}.

    "damaged": a file of the step's runs differs from what its manifest records (`damaged_files`): it is
    restored, not rebuilt, and the steps built from it are not called stale for it.
    code_root: the folder holding labkit/ and the data (a copy of the repository, in tests)."""
    cache = read_cache(preset)
    sources = Sources.in_folder(code_root)
    damaged = {step.name: damaged_files(step, preset) for step in steps if step.is_built(preset)}
    every_damaged = {path for paths in damaged.values() for path in paths}
    verdicts = {}
    for step in steps:
        if not step.is_built(preset):
            verdicts[step.name] = {"status": "missing", "changed": []}
            continue
        if damaged[step.name]:
            verdicts[step.name] = {"status": "damaged", "changed": damaged[step.name]}
            continue
        entry = cache.get(step.name)
        if entry is None or is_byte_record(entry):
            why = ["recorded by file bytes only: `python -m labkit cache restamp`"] if entry else []
            verdicts[step.name] = {"status": "unrecorded", "changed": why}
            continue
        now = inputs(step, preset, sources, code_root)
        what = [f"code {k}" for k in changed(entry["code"], now["code"])]
        what += [k for k in changed(entry["files"], now["files"]) if k not in every_damaged]
        verdicts[step.name] = {"status": "stale" if what else "fresh", "changed": what}
    return verdicts


def to_rebuild(steps: tuple[CacheStep, ...], verdicts: dict[str, dict]) -> list[str]:
    """The stale steps and every step downstream of one (its upstream files or `then`), in `steps` order.

    A rebuilt step changes its output files, so whatever was built from them is stale
    too, even if its own check still says fresh.
    """
    chosen = {name for name, v in verdicts.items() if v["status"] == "stale"}
    grew = True
    while grew:
        grew = False
        folders = {_step_named(steps, n).folder for n in chosen}
        for step in steps:
            if step.name in chosen:
                continue
            upstream_rebuilt = any(rel.split("/")[0] in folders for rel in step.upstream)
            if upstream_rebuilt or any(step.name in _step_named(steps, n).then for n in chosen):
                chosen.add(step.name)
                grew = True
    return [s.name for s in steps if s.name in chosen]


def format_check(verdicts: dict[str, dict], shown: int = 6) -> str:
    lines = []
    for name, v in verdicts.items():
        what = v["changed"][:shown] + ([f"{len(v['changed']) - shown} more"] if len(v["changed"]) > shown else [])
        detail = f" (changed: {', '.join(what)})" if what else ""
        lines.append(f"{name:<16} {v['status']}{detail}")
    return "\n".join(lines)


# -- Adopting the fingerprints without a rebuild ---------------------------------------------------------

class RestampRefused(ValueError):
    """The byte digests a step was recorded with do not prove which code made it."""


def restamp(step: CacheStep, preset: str, commit: str, repo: Path = REPO_ROOT) -> dict:
    """The fingerprint record of a step that was recorded by file bytes, computed from exactly the code
    that made it.

    The byte record at `commit` ({path: SHA-256} of every module the step imported, its data and its
    upstream files) proves which code built the step only where `commit` holds those very bytes; the
    fingerprint is then computed from that commit's sources, never from the working tree.  Refused
    (naming the file) when a recorded file differs at `commit`, or when the step reaches a module its
    byte record did not cover (outside its `unrecorded` ones)."""
    legacy = byte_record_at(preset, step.name, commit, repo)
    check_byte_record(step.name, legacy, preset, commit, repo)
    sources = Sources.at_commit(repo, commit)
    code = code_fingerprint(step, sources)
    uncovered = sorted(sources.files_of(code) - set(legacy))
    if uncovered:
        raise RestampRefused(f"{step.name} reaches {', '.join(uncovered)}, which its byte record does not cover")
    files = {rel: legacy.get(rel) for rel in step.files}
    files.update({f"runs/{preset}/{rel}": legacy.get(f"runs/{preset}/{rel}") for rel in step.upstream})
    return {"code": code, "files": files, "restamped_from": resolve_commit(commit, repo)}


def check_byte_record(name: str, record: dict, preset: str, commit: str, repo: Path = REPO_ROOT) -> None:
    """Refuse (naming `name` and the file) unless every file of a byte record, run files aside, is at
    `commit` with the recorded SHA-256: only then does the record prove that commit's code made it."""
    for rel, digest in record.items():
        if rel.startswith(f"runs/{preset}/"):
            continue  # run files are outputs: compared with the working tree by `check`, as before
        try:
            data = git_show(repo, commit, rel)
        except Exception:  # noqa: BLE001  (git names the missing path; we name the step too)
            raise RestampRefused(f"{name}: {rel} is recorded but {commit} does not hold it") from None
        if sha256_bytes(data) != digest:
            raise RestampRefused(f"{name}: {rel} at {commit} is not the file it was built with "
                                 f"(SHA-256 {sha256_bytes(data)[:12]}..., recorded {digest[:12]}...)")


def byte_record_at(preset: str, name: str, commit: str, repo: Path) -> dict:
    import json

    rel = f"runs/{preset}/{CACHE_FILE}"
    try:
        cache = json.loads(git_show(repo, commit, rel))
    except Exception:  # noqa: BLE001
        raise RestampRefused(f"{commit} holds no {rel}") from None
    entry = cache.get(name)
    if entry is None or not is_byte_record(entry):
        raise RestampRefused(f"{name}: {rel} at {commit} holds no byte record of it")
    return entry


def resolve_commit(commit: str, repo: Path = REPO_ROOT) -> str:
    """The full hash of `commit` (a name such as HEAD moves; the hash does not)."""
    import subprocess

    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode:
        raise RestampRefused(f"--commit {commit}: not a commit of {repo}")
    return done.stdout.strip()
