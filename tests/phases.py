"""Run `make test`'s phases, two at a time where they are independent, and print their wall times and memory.

    python tests/phases.py [--only NAME ...] [--list]

A student's laptop has two cores; most phases are one process on one core, so independent
phases run side by side (each group below starts together and the next group waits for it).
Each phase's output goes to _build/test-logs/<name>.log; a failing phase's last lines are
printed, and the run stops after the group that failed, exiting with the first failing code.

CPU time: the user and system seconds of the phase's process and of every descendant it waited
for (os.wait4's usage); a process reaped by another parent, such as a browser's helpers, is missed.

Memory: while a group runs, the proportional set sizes (Pss: resident memory, a page shared by
several processes counted once between them) of every process under this one are summed every
0.5 s (each sample reads every process's smaps_rollup: every 0.2 s, the sampler took a sixth of a
core); a phase's peak is the largest sum seen over its own processes, the group's peak the largest
sum over all of them.  A spike shorter than the interval can be missed; `ru_maxrss`
(the largest single process's resident peak, from the kernel) is printed beside it as a check,
with one caveat: a process that resets its own peak counter (/proc/self/clear_refs, as the smoke
does at each stage to measure it) reports only the peak since its last reset.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
PORTABLE = {"ATEN_CPU_CAPABILITY": "default"}  # PyTorch's portable kernels: they round differently
LOGS = ROOT / "_build" / "test-logs"

# (name, command, extra environment); phases in one inner list run side by side, and the whole run stays
# under 6 GB, a laptop's budget.  The qwen smoke (tests/test_smoke.py: 2 layers at a quarter of Qwen's
# width and its full 151,936-token vocabulary, 1.6 GiB) runs beside nbval (0.9 GiB) and the short book builds
# (0.2 GiB); the two browser checks (1 GiB each) need the books.
SMOKE = "tests/test_smoke.py"
# The unit passes hand out files in conftest.py's order, slowest first (with --no-loadscope-reorder; xdist
# would sort them by their number of tests), so that both workers end together (210 -> 178 s).  They do
# not load nbval's plugin (its nbformat and jsonschema imports cost 2 s in each of a pass's three
# processes); the portable pass names its files, so that pytest imports only those.  Two workers: alone, with
# two or three workers, the first unit pass keeps both cores 98% busy, and a third worker only adds its own
# collection (20 s of CPU) and imports and crowds the caches (alone on a quiet machine, 2026-12-06: 256 s
# with three workers, 214 s with two).
UNIT_WORKERS = "2"
# The tests marked `slow` (fault injection and a Dask cluster, 20 s or more each) are left out: `make test-slow`
# runs them, and CI runs it after `make test`.
# The files that take longest, named first: pytest-xdist hands whole files to the workers in the order
# they are collected (alphabetical), so a long file that comes late ends the phase alone.  Started
# first, they run beside the many short files instead.  (pytest collects a file named twice once.)
LONGEST_FIRST = ["tests/test_grpo.py", "tests/test_variants.py", "tests/test_results_page.py", "tests/test_reasoning_loop.py",
                 "tests/test_pretrain_resume.py", "tests/test_ablations.py", "tests/test_group_size.py",
                 "tests/test_sft.py", "tests/test_sweep.py"]  # measured 2026-12-07 (tests/conftest.py: the same order)
sys.path.insert(0, str(ROOT / "tests"))
from portable import PORTABLE_FILES, PORTABLE_TESTS  # noqa: E402  (no imports of its own: no torch here)

PORTABLE_PATHS = sorted(f"tests/{name}" for name in PORTABLE_FILES | set(PORTABLE_TESTS))
STUDENT_HTML = "_build/student_src/_build/html"  # the Makefile's STUDENT_HTML
# both books built, then both opened in headless Chromium side by side (the checks of `make browser-check`); the
# phase fails when a build or either check fails
BOOKS_THEN_BROWSERS = (
    "make --no-print-directory book && make --no-print-directory student-book && "
    f"{{ {PY} tests/browser_check.py _build/html --screenshots _build/screenshots & instructor=$!; "
    f"{PY} tests/browser_check.py {STUDENT_HTML} --screenshots _build/screenshots/student && "
    f"{PY} -m labkit.book.build check-student {STUDENT_HTML}; student=$?; wait $instructor && test $student -eq 0; }}")
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))
NBVAL = [PY, "-m", "pytest", "-q", "--nbval", "--nbval-current-env"]
GROUPS = [
    [("prepare", ["make", "--no-print-directory", "setup", "mathjax", "browser"], {})],  # once, before phases share them
    # the unit tests on both cores (two workers), beside the books, whose browser checks follow their builds in
    # the same phase: the builds and checks mostly wait (83 CPU seconds in 221 s of wall time on 2026-12-07)
    [("unit", [PY, "-m", "pytest", "-q", "-p", "no:nbval", "-n", UNIT_WORKERS, "--dist", "loadfile",
               "--no-loadscope-reorder", "--durations=25", "-m", "not slow", f"--ignore={SMOKE}", *LONGEST_FIRST,
               "tests"], {}),
     ("books and their browser checks", ["sh", "-c", BOOKS_THEN_BROWSERS], {})],
    # nbval in two halves (every other chapter) beside the smoke: three one-core processes
    [("nbval, first half", [*NBVAL, *NOTEBOOKS[0::2]], {}),
     ("nbval, second half", [*NBVAL, *NOTEBOOKS[1::2]], {}),
     ("qwen smoke", [PY, "-m", "pytest", "-q", "-p", "no:nbval", SMOKE], {})],
]
# `make test-slow` (CI runs it after `make test`): what a student's machine need not run to trust its own results.
# The tests marked `slow` (fault injection, a Dask cluster), and the checks that the stored outputs hold on other
# CPUs: nbval and the unit tests marked `portable` again under PyTorch's portable kernels, which round as another
# CPU's might (a stored value that passes under both kernel families holds on other machines too).  They left
# `make test` on 2026-12-07: with them it took 11.7 minutes of its 8 on two cores (1,250 CPU seconds).
SLOW_GROUPS = [
    [("prepare", ["make", "--no-print-directory", "setup"], {})],
    [("unit, slow", [PY, "-m", "pytest", "-q", "-p", "no:nbval", "-n", "2", "--dist", "loadfile", "--durations=15",
                     "-m", "slow", "tests"], {})],
    [("nbval, portable kernels, first half", [*NBVAL, *NOTEBOOKS[0::2]], PORTABLE),
     ("nbval, portable kernels, second half", [*NBVAL, *NOTEBOOKS[1::2]], PORTABLE)],
    [("unit, portable kernels", [PY, "-m", "pytest", "-q", "-p", "no:nbval", "-n", "2", "--dist", "loadfile",
                                 "--no-loadscope-reorder", "--durations=15", "-m", "portable", *PORTABLE_PATHS],
      PORTABLE)],
]
NAMES = [name for group in GROUPS + SLOW_GROUPS for name, _, _ in group]


def _children() -> dict[int, list[int]]:
    """{parent pid: [child pids]} of every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state letter
        tree.setdefault(parent, []).append(int(entry))
    return tree


def _memory_bytes(pid: int) -> int:
    """The process's proportional set size (Pss: its private pages, plus its share of pages it shares
    with others, such as torch's libraries), so that a sum over processes counts each page once."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(root: int, tree: dict[int, list[int]]) -> int:
    """Resident bytes of `root` and all its descendants."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _memory_bytes(pid)
        stack.extend(tree.get(pid, ()))
    return total


def phase_env(extra: dict) -> dict:
    """The environment of a phase: this one plus `extra`, with bytecode caches allowed.  The phases start
    hundreds of Python processes (pytest workers, the runs the tests start, one kernel per notebook and
    pass): with PYTHONDONTWRITEBYTECODE set (as some shells and CI images do) each would compile the
    lab's modules again, and each pytest worker would rewrite every test module's asserts (6 s a worker).
    The caches go to __pycache__ folders, which git ignores."""
    env = {**os.environ, **extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_group(group, interval: float = 0.5) -> list[dict]:
    """Start the group's phases together, sample their memory until all end; one result per phase."""
    LOGS.mkdir(parents=True, exist_ok=True)
    running = []
    for name, command, extra in group:
        log = open(LOGS / f"{name.replace(', ', '-').replace(' ', '-')}.log", "w")
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=phase_env(extra))
        running.append(dict(name=name, process=process, log=log, start=start, peak=0, seconds=None))
    group_peak = 0
    while any(r["seconds"] is None for r in running):
        tree = _children() if sys.platform.startswith("linux") else {}
        total = 0
        for r in running:
            if r["seconds"] is None:
                # wait4 reaps the phase and gives its CPU time, that of every descendant it waited for included
                pid, status, usage = os.wait4(r["process"].pid, os.WNOHANG)
                if pid:
                    r["seconds"] = time.perf_counter() - r["start"]
                    r["code"], r["cpu"] = os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
                    r["process"].returncode = r["code"]  # reaped here, so Popen must not wait for it again
                    r["log"].close()
                    continue
                rss = tree_rss(r["process"].pid, tree)
                r["peak"], total = max(r["peak"], rss), total + rss
        group_peak = max(group_peak, total)
        time.sleep(interval)
    for r in running:
        r["group_peak"] = group_peak
    return running


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def summary_line(path: Path) -> str:
    """pytest's last line ("N passed in ..."), or make's last line."""
    text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return text[-1].strip("= ") if text else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME", help=f"run only these phases: {NAMES}")
    parser.add_argument("--list", action="store_true", help="print the phases and their commands, run nothing")
    parser.add_argument("--slow", action="store_true", help="`make test-slow`'s phases instead: the slow tests and "
                                                            "the checks under the portable kernels")
    args = parser.parse_args(argv)
    target = "make test-slow" if args.slow else "make test"
    groups = [[p for p in group if not args.only or p[0] in args.only] for group in (SLOW_GROUPS if args.slow else GROUPS)]
    groups = [g for g in groups if g]
    if args.list:
        for i, group in enumerate(groups, 1):
            for name, command, extra in group:
                env = " ".join(f"{k}={v}" for k, v in extra.items())
                print(f"group {i}: {name:<26} {env + ' ' if env else ''}{' '.join(command)}")
        return 0
    began, results, code = time.perf_counter(), [], 0
    for group in groups:
        names = " and ".join(name for name, _, _ in group)
        print(f"{target}: {names} ...", flush=True)
        done = run_group(group)
        results += done
        for r in done:
            log = Path(r["log"].name)
            verdict = "ok" if r["code"] == 0 else f"FAILED (exit {r['code']})"
            print(f"  {r['name']}: {verdict} in {r['seconds']:.0f} s: {summary_line(log)}", flush=True)
            if r["code"] != 0:
                print(f"--- last lines of {log.relative_to(ROOT)} ---\n{tail(log)}\n---", flush=True)
                code = code or r["code"]
        if code:
            break
    wall = time.perf_counter() - began
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
    print(f"\n{'phase':<28}{'wall s':>8}{'CPU s':>8}{'peak GiB':>10}{'its group, peak GiB':>21}")
    for r in results:
        print(f"{r['name']:<28}{r['seconds']:>8.0f}{r['cpu']:>8.0f}{r['peak'] / 2**30:>10.2f}"
              f"{r['group_peak'] / 2**30:>21.2f}")
    print(f"{target:<28}{wall:>8.0f}{sum(r['cpu'] for r in results):>8.0f}"
          f"{max(r['group_peak'] for r in results) / 2**30:>10.2f}"
          f"   (ru_maxrss of the largest process: {largest / 2**30:.2f} GiB; it misses a peak that a process"
          " reset itself, as the smoke does at each stage)")
    print(f"{target}: " + ("passed" if code == 0 else "FAILED"), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
