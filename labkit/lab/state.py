"""Full resumable training state: capture, restore, save (gzip level 1), load, compare exactly.

A *state* is a plain nested dict holding everything a run needs to continue as
if it had never stopped:

    model        the model's state_dict (every parameter and buffer)
    optimizer    the optimizer's state_dict (AdamW moments, step counts, param groups)
    scheduler    the schedule's position (the index of the next update) and its settings
    data_order   the current permutation of the examples / prompts and the cursor in it
    generators   the states of the run's own torch.Generators (data order, sampling)
    rng          Python `random`, NumPy, Torch CPU (and CUDA, if present) RNG states
    history      one dict per update (losses, learning rates, grad norms, ...)
    consumed_ids the ids already used (examples, rollouts): none may be used twice
    identity     what the run is (branch, config fingerprint, data and code digests)
    progress     counters (updates done, epochs done, ...)

Wall-clock times never enter the state: two runs that computed the same thing at
different speeds have equal states.  Times travel in the same file under a
separate `evidence` entry that `compare_states` does not look at.

File format.  `save_state` writes gzip (level 1: fast, lossless) of
`MAGIC + torch.save(payload)`, where payload = {"labkit_state_version": 1,
"state": ..., "evidence": ...}.  The file is ordinary gzip (`zcat` works).
Loading uses `torch.load(weights_only=False)`, i.e. unpickling, which can run
arbitrary code from a hostile file.  That is acceptable *only* because these
files are written locally by this lab: `load_state` refuses any file whose
decompressed bytes do not start with the lab's own MAGIC line, before anything
is unpickled, and then checks the version key.  Never load a state file someone
else gave you; never replace one with a third-party file.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import random
import struct
import time
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from .runs import atomic_writer, check_recorded_digest

STATE_VERSION = 1
VERSION_KEY = "labkit_state_version"
MAGIC = b"LABKIT-RESUMABLE-STATE v1\n"
STATE_SECTIONS = (
    "model",
    "optimizer",
    "scheduler",
    "data_order",
    "generators",
    "rng",
    "history",
    "consumed_ids",
    "identity",
    "progress",
)


class StateFileError(ValueError):
    """A file is not a state written by this lab (or not one this version reads)."""


# -- 1. RNGs -----------------------------------------------------------------------


def capture_rng() -> dict:
    """The global RNG states: Python `random`, NumPy, Torch CPU, and every CUDA device's."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(rng: Mapping) -> None:
    """Put back the global RNG states captured by `capture_rng`."""
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch_cpu"])
    cuda = list(rng["torch_cuda"])
    if cuda:
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(cuda):
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise ValueError(f"the state holds RNG states of {len(cuda)} CUDA device(s), this machine has {have}")
        torch.cuda.set_rng_state_all(cuda)


# -- 2. capture and restore ----------------------------------------------------------


def _detached_copy(obj, memo: dict | None = None):
    """A deep copy in which every tensor is a fresh CPU clone (no aliasing of live parameters).

    `model.state_dict()` and `optimizer.state_dict()` return references to the
    tensors being trained: without the clone, a state captured after epoch 1
    would silently become the state after epoch 2.  A tensor reached twice (the
    tied embedding is both `model.embed_tokens.weight` and `lm_head.weight`) is
    cloned once and stays shared, so torch.save stores it once.
    """
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        # state_dict() returns a new detached view per name, so identity is the memory, not id()
        key = (str(obj.device), obj.untyped_storage().data_ptr(), obj.storage_offset(),
               tuple(obj.shape), obj.stride(), obj.dtype)
        if key not in memo:
            memo[key] = obj.detach().to("cpu", copy=True)
        return memo[key]
    if isinstance(obj, Mapping):
        return type(obj)((k, _detached_copy(v, memo)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_detached_copy(v, memo) for v in obj)
    return copy.deepcopy(obj)


def capture_state(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: dict,
    data_order: dict,
    generators: Mapping[str, torch.Generator],
    history: list,
    consumed_ids: list,
    identity: dict,
    progress: dict,
) -> dict:
    """Snapshot every section of a run (see the module docstring); nothing aliases live objects."""
    return {
        "model": _detached_copy(model.state_dict()),
        "optimizer": _detached_copy(optimizer.state_dict()),
        "scheduler": _detached_copy(scheduler),
        "data_order": _detached_copy(data_order),
        "generators": {name: g.get_state().clone() for name, g in generators.items()},
        "rng": _detached_copy(capture_rng()),
        "history": _detached_copy(history),
        "consumed_ids": list(consumed_ids),
        "identity": _detached_copy(identity),
        "progress": _detached_copy(progress),
    }


def restore_state(
    state: Mapping,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generators: Mapping[str, torch.Generator],
) -> dict:
    """Load model, optimizer, generators and global RNGs from `state`, in place.

    Returns copies of the plain sections (scheduler, data_order, history,
    consumed_ids, identity, progress) for the caller's loop to continue from.
    The global RNGs are restored last, so nothing here consumes random numbers
    after them.
    """
    missing = [s for s in STATE_SECTIONS if s not in state]
    if missing:
        raise ValueError(f"the state lacks the section(s) {missing}; a full state has {list(STATE_SECTIONS)}")
    if set(state["generators"]) != set(generators):
        raise ValueError(
            f"the state holds generators {sorted(state['generators'])}, the run has {sorted(generators)}"
        )
    model.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(_detached_copy(state["optimizer"]))
    for name, g in generators.items():
        g.set_state(state["generators"][name].clone())
    restore_rng(state["rng"])
    return {k: _detached_copy(state[k]) for k in ("scheduler", "data_order", "history", "consumed_ids", "identity", "progress")}


# -- 3. save and load ---------------------------------------------------------------------


class _CountingSink:
    """A write-only file that passes bytes on to `target`, counting them and hashing them."""

    def __init__(self, target):
        self.target, self.bytes, self.sha256 = target, 0, hashlib.sha256()
        self.error: OSError | None = None  # torch.save turns a writer's OSError into a bare RuntimeError

    def write(self, data) -> int:
        view = memoryview(data)
        try:
            self.target.write(view)
        except OSError as err:  # e.g. no space left on device: kept so save_state can raise it as it was
            self.error = self.error or err
            raise
        self.bytes += view.nbytes
        self.sha256.update(view)
        return view.nbytes

    def flush(self) -> None:
        self.target.flush()


def save_state(path: str | Path, state: dict, evidence: dict | None = None, compresslevel: int = 1) -> dict:
    """Write `state` (and the uncompared `evidence`, e.g. timings) as gzip level 1, atomically.

    compresslevel: 1 (the lab's runs: fast, float32 weights shrink only to about 93%); 0 stores the
    bytes uncompressed in the same gzip format (a test that measures something else).

    The tensors stream through the compressor into a temporary file that is renamed into
    place: no uncompressed or compressed copy of the whole state is ever held in memory
    (the save needs little beyond the state itself, which lets a full-size qwen state be
    saved on a machine with twice its size in memory).
    Returns {"path", "bytes", "raw_bytes", "sha256", "save_seconds"}: the file's size,
    the size before compression, its digest, and the time the save took.
    """
    begun = time.perf_counter()
    with atomic_writer(path) as f:
        compressed = _CountingSink(f)
        # mtime=0 and no file name: the same state gives the same bytes, so the digest names the content
        with gzip.GzipFile(filename="", mode="wb", compresslevel=compresslevel, fileobj=compressed,
                           mtime=0) as gz:
            raw = _CountingSink(gz)
            try:
                raw.write(MAGIC)
                torch.save({VERSION_KEY: STATE_VERSION, "state": state, "evidence": evidence or {}}, raw)
            except RuntimeError:
                if raw.error is not None:
                    raise raw.error from None
                raise
    return {
        "path": str(path),
        "bytes": compressed.bytes,
        "raw_bytes": raw.bytes,
        "sha256": compressed.sha256.hexdigest(),
        "save_seconds": time.perf_counter() - begun,
    }


def load_state(path: str | Path) -> tuple[dict, dict]:
    """Read a state written by `save_state`; returns (state, evidence), tensors on the CPU.

    Refuses (StateFileError) any file that is not gzip, lacks the lab's MAGIC line,
    or carries another version, before unpickling it: unpickling is allowed only
    for files this lab wrote locally.  Memory: about twice the state's tensors at the peak (the
    decompressed bytes, then those and the loaded tensors); the compressed file is streamed.
    """
    path = Path(path)
    check_recorded_digest(path)  # the digest its run folder recorded when it was saved
    with open(path, "rb") as f:
        head = f.read(2)
    if head != b"\x1f\x8b":
        raise StateFileError(f"{path} is not a gzip file, so not a state written by labkit.lab.state.save_state")
    try:
        with gzip.open(path, "rb") as gz:  # streamed: the compressed file is never held whole
            if gz.read(len(MAGIC)) != MAGIC:
                raise StateFileError(
                    f"{path} does not start with the lab's header {MAGIC!r}; refusing to unpickle a file "
                    "this lab did not write"
                )
            raw = gz.read()  # the payload without the header (bytes: io.BytesIO shares it, no copy)
    except (OSError, EOFError, zlib.error) as err:  # a flipped bit or a cut file: gzip's own checks catch it
        raise StateFileError(f"{path} is damaged or truncated ({type(err).__name__}: {err})") from None
    payload = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=False)
    del raw
    version = payload.get(VERSION_KEY) if isinstance(payload, dict) else None
    if version != STATE_VERSION:
        raise StateFileError(f"{path} has {VERSION_KEY}={version!r}; this labkit reads version {STATE_VERSION}")
    return payload["state"], payload["evidence"]


# -- 4. exact comparison ---------------------------------------------------------------------

_SCALARS = (bool, int, float, str, bytes, type(None))
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bitwise(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers, so that NaN equals the same NaN and -0.0 differs from 0.0."""
    t = t.detach().to("cpu").contiguous()
    if t.is_floating_point() or t.is_complex():
        return t.view(_INT_VIEW[t.element_size()]) if t.element_size() in _INT_VIEW else t.view(torch.uint8)
    return t


def _tensor_verdict(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    ba, bb = _bitwise(a), _bitwise(b)
    if torch.equal(ba, bb):
        return "equal"
    diff = (ba != bb).reshape(a.shape) if a.dim() else (ba != bb)
    count = int(diff.sum())
    first = tuple(int(i) for i in diff.nonzero()[0]) if a.dim() else ()
    va, vb = a.detach().cpu()[first].item(), b.detach().cpu()[first].item()
    return f"{count} of {a.numel()} elements differ; first at {list(first)}: {va!r} vs {vb!r}"


def _scalar_equal(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)  # bitwise, like the tensors
    return a == b


def _scalar_verdict(a, b) -> str:
    if type(a) is not type(b):
        return f"type {type(a).__name__} vs {type(b).__name__} ({a!r} vs {b!r})"
    return "equal" if _scalar_equal(a, b) else f"{a!r} vs {b!r}"


def _is_scalar_sequence(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(v, _SCALARS) for v in x)


def _sequence_verdict(a, b) -> str:
    if type(a) is not type(b):
        return f"type {type(a).__name__} vs {type(b).__name__}"
    if len(a) != len(b):
        return f"length {len(a)} vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if not _scalar_equal(x, y):
            return f"{len(a)} items; first difference at [{i}]: {_scalar_verdict(x, y)}"
    return "equal"


def _key_order(key) -> tuple:
    return (type(key).__name__, str(key))


def _walk(a, b, path: str, fields: dict[str, str]) -> None:
    """Fill `fields` with one verdict per leaf: tensors, arrays, scalars, lists of scalars."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            fields[path] = f"type {type(a).__name__} vs {type(b).__name__}"
        else:
            fields[path] = _tensor_verdict(a, b)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            fields[path] = f"type {type(a).__name__} vs {type(b).__name__}"
        else:
            fields[path] = _tensor_verdict(torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b)))
    elif isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            fields[path] = f"type {type(a).__name__} vs {type(b).__name__}"
            return
        for key in sorted(set(a) | set(b), key=_key_order):
            sub = f"{path}/{key}" if path else str(key)
            if key not in b:
                fields[sub] = "missing in b"
            elif key not in a:
                fields[sub] = "missing in a"
            else:
                _walk(a[key], b[key], sub, fields)
    elif _is_scalar_sequence(a) and _is_scalar_sequence(b):
        fields[path] = _sequence_verdict(a, b)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            fields[path] = _sequence_verdict(a, b) if type(a) is not type(b) else f"length {len(a)} vs {len(b)}"
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{path}/{i}", fields)
    elif isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        fields[path] = _scalar_verdict(a, b)
    else:
        raise TypeError(f"compare_states cannot compare {type(a).__name__} at {path!r}; states hold tensors, arrays, dicts, lists and scalars")


def compare_states(a: Mapping, b: Mapping) -> dict:
    """Compare two states field by field, exactly; returns a JSON-ready report.

    Every leaf is compared: tensors and arrays bitwise with dtype and shape (so
    0.0 vs -0.0 and two different NaNs differ), scalars by type and value, lists
    of scalars item by item, dict keys as sets.  Report:

        equal              True only when every compared field is equal
        compared_fields    number of leaves compared
        different_fields   the paths of the leaves that differ
        sections           per top-level section: equal, fields, different
        fields             every leaf path -> "equal" or what differs
    """
    fields: dict[str, str] = {}
    _walk(a, b, "", fields)
    different = [p for p, v in fields.items() if v != "equal"]
    sections: dict[str, dict] = {}
    for p, v in fields.items():
        s = sections.setdefault(p.split("/", 1)[0], {"equal": True, "fields": 0, "different": 0})
        s["fields"] += 1
        if v != "equal":
            s["equal"] = False
            s["different"] += 1
    return {
        "equal": bool(fields) and not different,
        "compared_fields": len(fields),
        "different_fields": different,
        "sections": sections,
        "fields": fields,
    }


def compare_state_files(path_a: str | Path, path_b: str | Path) -> dict:
    """`compare_states` of two saved states (their evidence, e.g. timings, is not compared)."""
    return compare_states(load_state(path_a)[0], load_state(path_b)[0])
