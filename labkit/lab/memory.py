"""The process's memory, measured one way for the whole lab: peak resident set on the host (Linux's
VmHWM, resettable; getrusage's maxrss elsewhere) and peak allocation on CUDA.

`python -m labkit smoke` measures each stage with these, `labkit.bench.kl` the KL's forward and
backward, and `labkit.eval.evaluate` each decoding mode (`reset_peak` / `peak`).
"""

from __future__ import annotations

import sys


def _proc_field_kib(path: str, field_name: str) -> int | None:
    """A "Name:  value kB" field of a /proc file, in KiB (Linux), else None."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def status_kib(field_name: str) -> int | None:
    """A /proc/self/status field in KiB (Linux), else None."""
    return _proc_field_kib("/proc/self/status", field_name)


def meminfo_bytes(field_name: str) -> int | None:
    """A /proc/meminfo field in bytes (Linux), else None."""
    kib = _proc_field_kib("/proc/meminfo", field_name)
    return None if kib is None else kib * 1024


def reset_host_peak() -> bool:
    """Reset the process's peak RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_peak_bytes() -> int:
    """The process's peak resident set: VmHWM where Linux has it, else getrusage's maxrss."""
    kib = status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    try:
        import resource
    except ImportError:  # Windows has no `resource` module (the lab runs there under WSL)
        return 0
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def peak_rss_delta_bytes(work) -> int | None:
    """Peak resident set above the current one while `work()` runs (Linux), else None."""
    if not reset_host_peak():
        return None
    before = status_kib("VmRSS")
    if before is None:
        return None
    work()
    return host_peak_bytes() - before * 1024


def reset_peak(device: str) -> bool:
    """Start a new peak: CUDA's allocation peak, or the process's peak RSS (where Linux can reset it).
    Returns whether the peak now counts from here."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return True
    return reset_host_peak()


def peak(device: str, was_reset: bool) -> tuple[int, str]:
    """(bytes, what they measure) since `reset_peak(device)` returned `was_reset`: CUDA's peak
    allocation, or the process's peak resident set (its peak so far where it could not be reset)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated, reset per mode"
    if was_reset:
        return host_peak_bytes(), "peak RSS of the process (VmHWM), reset per mode (CPU)"
    return host_peak_bytes(), "peak RSS of the process so far (CPU; not reset per mode)"
