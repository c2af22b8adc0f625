"""Benchmark: the blocked exact prefix KL against a naive full-vocabulary KL, on CPU.

    naive    F.kl_div(F.log_softmax(z_ref), F.log_softmax(z_cur), log_target=True).sum(-1)
    blocked  labkit.grpo.losses.exact_prefix_kl(z_cur, z_ref, block_size)

Both run forward and backward (gradient for the current logits only; the reference is
frozen, as in training) on the same float32 logits, in one process, one after the other.

Time: median over `--repeats` runs after one warm-up, forward and backward timed apart;
the runs of the two methods alternate, so a change in the machine's load hits both alike.
One thread by default: on a shared machine, multi-threaded timings mostly measure the
other processes (the blocked loop runs ~40x more, smaller, parallel operations, and each
waits for its slowest thread); `--threads 0` keeps torch's own setting.

Extra memory: the peak, during one forward + backward, of the bytes PyTorch's CPU
allocator holds beyond what was alive before the call (the two logit tensors).  It is
read from the allocation trace of `torch.profiler` (profile_memory=True): every
allocation and free with its size, in time order, summed; the running maximum is the
peak.  This counts every tensor PyTorch creates (temporaries, tensors saved for
backward, the returned gradient) and nothing else.  The gradient of the current logits
(N x V floats) is part of both peaks: both methods must return it.  As a cross-check
from the operating system, the peak resident set size above the starting one is also
printed (Linux only; it includes allocator and page granularity, so it is coarser).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.nn.functional as F

from ..lab import memory
from ..grpo.losses import exact_prefix_kl

QWEN_VOCAB = 151_936


def naive_kl(logits_cur: torch.Tensor, logits_ref: torch.Tensor) -> torch.Tensor:
    """KL(p_cur || p_ref) per row with full (N, V) log-softmax tensors. (N, V) -> (N,)."""
    log_q = F.log_softmax(logits_ref, dim=-1)
    log_p = F.log_softmax(logits_cur, dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(dim=-1)


def _forward_backward(kl_fn, logits_cur, logits_ref) -> tuple[float, float]:
    """One forward and backward; returns (forward seconds, backward seconds)."""
    logits_cur.grad = None
    start = time.perf_counter()
    kl = kl_fn(logits_cur, logits_ref)
    middle = time.perf_counter()
    kl.sum().backward()
    end = time.perf_counter()
    return middle - start, end - middle


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's C++ start/stop lines), then restore it."""
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_allocated_bytes(kl_fn, logits_cur, logits_ref) -> int | None:
    """Peak bytes the CPU allocator holds above the starting point during forward + backward.

    Reads the profiler's raw allocation events (sizes are negative for frees).  Uses
    `experimental_event_tree`, a private PyTorch interface; returns None if it is missing.
    """
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch._C._profiler import _EventType
    except ImportError:
        return None
    logits_cur.grad = None
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        kl_fn(logits_cur, logits_ref).sum().backward()
    try:
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError:
        return None
    events, stack = [], list(roots)
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
        stack.extend(event.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak


def peak_rss_delta_bytes(kl_fn, logits_cur, logits_ref) -> int | None:
    """Peak resident set size above the current one during forward + backward (Linux)."""
    logits_cur.grad = None
    return memory.peak_rss_delta_bytes(lambda: kl_fn(logits_cur, logits_ref).sum().backward())


def agreement(methods: dict, logits_cur: torch.Tensor, logits_ref: torch.Tensor) -> tuple[float, float, dict, float]:
    """Both methods must compute the same thing before their costs mean anything.

    Returns (max |value difference|, max |gradient difference|, each method's max error against
    a float64 reference, the mean KL)."""
    values, grads = {}, {}
    for name, fn in methods.items():
        logits_cur.grad = None
        values[name] = fn(logits_cur, logits_ref)
        values[name].sum().backward()
        grads[name] = logits_cur.grad.clone()
    value_diff = (values["blocked"] - values["naive"]).abs().max().item()
    grad_diff = (grads["blocked"] - grads["naive"]).abs().max().item()
    with torch.no_grad():  # a float64 reference tells which float32 result is closer (8 rows at a time)
        reference = torch.cat([naive_kl(cur.double(), ref.double())
                               for cur, ref in zip(logits_cur.split(8), logits_ref.split(8))])
    errors = {name: (v.double() - reference).abs().max().item() for name, v in values.items()}
    logits_cur.grad = None
    return value_diff, grad_diff, errors, reference.mean().item()


def measure(methods: dict, logits_cur: torch.Tensor, logits_ref: torch.Tensor, repeats: int) -> dict:
    """Median forward, backward and total seconds, and extra memory, of each method.

    Repetitions alternate between the methods, so a change in the machine's load during the
    run (other processes on the same cores) affects both alike."""
    for fn in methods.values():
        _forward_backward(fn, logits_cur, logits_ref)  # warm-up
    times = {name: [] for name in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            times[name].append(_forward_backward(fn, logits_cur, logits_ref))
    results = {}
    for name, fn in methods.items():
        results[name] = {
            "forward": statistics.median(t[0] for t in times[name]),
            "backward": statistics.median(t[1] for t in times[name]),
            "total": statistics.median(t[0] + t[1] for t in times[name]),
            "alloc": peak_allocated_bytes(fn, logits_cur, logits_ref),
            "rss": peak_rss_delta_bytes(fn, logits_cur, logits_ref),
        }
    logits_cur.grad = None
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit bench kl", description=__doc__.splitlines()[0])
    parser.add_argument("--prefixes", type=int, default=64, help="rows N of the logits (default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB, help="vocabulary size V (default: %(default)s, Qwen2.5)")
    parser.add_argument("--block-size", type=int, default=4096, help="vocabulary block of the exact KL (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method, after one warm-up (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 0 keeps torch's default (default: %(default)s, reproducible on a shared machine)")
    args = parser.parse_args(argv)
    for name in ("prefixes", "vocab", "block_size", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(0)
    logits_cur = (3 * torch.randn(args.prefixes, args.vocab, generator=gen)).requires_grad_()
    logits_ref = logits_cur.detach() + 0.5 * torch.randn(args.prefixes, args.vocab, generator=gen)

    def blocked_kl(cur, ref):
        return exact_prefix_kl(cur, ref, block_size=args.block_size)

    methods = {"naive": naive_kl, "blocked": blocked_kl}

    value_diff, grad_diff, errors, kl_mean = agreement(methods, logits_cur, logits_ref)
    results = measure(methods, logits_cur, logits_ref, args.repeats)

    mib = 2**20
    full_bytes = args.prefixes * args.vocab * logits_cur.element_size()  # one (N, V) tensor
    block_bytes = args.prefixes * min(args.block_size, args.vocab) * logits_cur.element_size()

    def fmt_mib(nbytes):
        return "n/a" if nbytes is None else f"{nbytes / mib:.1f}"

    print(f"exact prefix KL, {args.prefixes} prefixes x {args.vocab:,} entries, float32, CPU, "
          f"{torch.get_num_threads()} thread(s), block {args.block_size}, median of {args.repeats}")
    if hasattr(os, "getloadavg"):
        # The blocked loop runs ~40 times more (smaller) parallel operations than the naive
        # one; when other processes crowd the cores, each waits on its slowest thread.
        print(f"machine: {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f} "
              f"(with several threads on busy cores the blocked loop's many small operations suffer most)")
    print(f"agreement: mean KL {kl_mean:.4f}; max |KL blocked - naive| = {value_diff:.1e}, "
          f"max |gradient difference| = {grad_diff:.1e}")
    print(f"max |KL - float64 reference|: naive {errors['naive']:.1e}, blocked {errors['blocked']:.1e}")
    print()
    print(f"{'method':<8} {'forward ms':>11} {'backward ms':>12} {'total ms':>9} {'extra MiB (allocator)':>22} {'extra MiB (RSS)':>16}")
    for name, r in results.items():
        print(f"{name:<8} {r['forward'] * 1e3:>11.1f} {r['backward'] * 1e3:>12.1f} {r['total'] * 1e3:>9.1f} "
              f"{fmt_mib(r['alloc']):>22} {fmt_mib(r['rss']):>16}")
    print()
    use_alloc = results["naive"]["alloc"] is not None and results["blocked"]["alloc"] is not None
    memory = "alloc" if use_alloc else "rss"
    print("extra memory = peak bytes above the start during one forward + backward, "
          + ("from the PyTorch allocator trace (torch.profiler, profile_memory=True)" if use_alloc
             else "from the peak resident set size (allocator trace unavailable)"))
    naive_extra, blocked_extra = results["naive"][memory], results["blocked"][memory]
    if naive_extra is not None and blocked_extra is not None:
        # In the units the design talks about: full (N, V) tensors and (N, block) blocks.
        print(f"  naive:   {naive_extra / full_bytes:.1f} full (N, V) tensors of {full_bytes / mib:.1f} MiB")
        print(f"  blocked: 1 full (N, V) tensor (the returned gradient, needed by both) + "
              f"{(blocked_extra - full_bytes) / block_bytes:.1f} blocks (N, {min(args.block_size, args.vocab)}) "
              f"of {block_bytes / mib:.1f} MiB")
        memory_ratio = f"{blocked_extra / naive_extra:.1f}x"
    else:
        memory_ratio = "n/a"
    time_ratio = results["blocked"]["total"] / results["naive"]["total"]
    print(f"time ratio: {time_ratio:.1f}x; extra memory ratio: {memory_ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
