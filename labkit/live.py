"""Run GRPO yourself, live, and watch it agree with the committed run (issue 55, item 4; chapter 6).

    python -m labkit live grpo [--iterations 10]        or, in a notebook, `live_grpo(10, on_iteration=...)`

The protocol's run again, from the committed warm start with the committed run's settings and seeds
(its sampler, one torch thread), into runs/scratch/live/grpo/.  It advances one iteration at a time, each
a stop-and-resume of the lab's own loop (`labkit.grpo.loop.run_grpo`): after every iteration a state is on
disk, so Ctrl-C keeps every finished iteration, and calling again (the same command, the same cell) goes
on from there.  Each iteration gives one line, beside the committed run's same iteration:

    iteration  mean reward  groups with no signal  seconds  |  committed: mean reward  no signal  agrees

"Agrees" means the iteration's rollouts are the committed run's, every token and every recorded log-prob.
On the machine that built the cache they are; another CPU may round a float differently and drift from
some iteration on: the line says so (the lab's exact-resume check makes the stop-and-resume itself change
nothing).
"""

from __future__ import annotations

import time
from pathlib import Path

from .lab.runs import REPO_ROOT, RunFolder, preset_folder, read_checked_json

LIVE_DIR = REPO_ROOT / "runs" / "scratch" / "live" / "grpo"


def _iteration_line(rows: list[dict], G: int) -> dict:
    """The mean reward and the share of silent groups of one iteration's rollout rows (prompt-major groups),
    as the loop's history defines them (`labkit.grpo.losses.zero_variance_groups`)."""
    import torch

    from .grpo import losses

    rewards = torch.tensor([float(r["reward"]) for r in rows]).reshape(-1, G)  # (P, G)
    return {"reward": float(rewards.mean()),
            "frac_reward_zero_std": float(losses.zero_variance_groups(rewards).float().mean())}


def live_grpo(iterations: int = 10, *, preset: str = "tiny", run_dir: str | Path | None = None,
              on_iteration=None, restart: bool = False) -> list[dict]:
    """Iterations 1..`iterations` of the protocol's run, one at a time, each compared with the committed run's.

    on_iteration(line): called after each iteration with {"iteration", "reward", "frac_reward_zero_std",
    "seconds", "committed": {...}, "agrees"} (a notebook redraws its figure there); default: print the line.
    restart: delete what an earlier live run left and begin at iteration 1.  Returns every line so far."""
    import torch

    from .config import get_preset
    from .grpo import loop

    committed_dir = preset_folder(preset, "grpo")
    committed = read_checked_json(committed_dir / "history.json")
    committed_rows = loop.read_rollouts(committed_dir)  # checked against the committed run's ledger
    manifest = RunFolder(committed_dir).manifest()
    total = manifest["identity"]["iterations"]
    if isinstance(iterations, bool) or not isinstance(iterations, int) or not 1 <= iterations <= total:
        raise ValueError(f"iterations {iterations!r}: must be an integer in 1..{total} (the committed run's)")
    folder = Path(run_dir or LIVE_DIR)
    if restart and folder.exists():
        import shutil

        shutil.rmtree(folder)
    config, G, sampler = get_preset(preset), manifest["identity"]["G"], manifest["identity"]["sampler"]
    report = on_iteration or (lambda line: print(format_line(line), flush=True))
    threads = torch.get_num_threads()
    torch.set_num_threads(manifest["environment"]["torch_threads"])  # the committed run's, so that it can agree
    lines = []
    try:
        for k in range(1, iterations + 1):
            if k > _iterations_done(folder):
                began = time.perf_counter()
                loop.run_grpo(config, folder, G=G, iterations=total, stop_after=k, sampler=sampler,
                              resume=k > 1, progress=False)
                seconds = time.perf_counter() - began
                _forget_older_states(folder, k)
            else:
                seconds = None  # done by an earlier call: read, not run again
            rows = [r for r in loop.read_rollouts(folder) if r["iteration"] == k]
            line = {"iteration": k, **_iteration_line(rows, G), "seconds": seconds,
                    "committed": {key: committed[k - 1][key] for key in ("reward", "frac_reward_zero_std")}}
            # agreement is the rollouts themselves, every token and recorded log-prob, not only their mean reward
            line["agrees"] = rows == [r for r in committed_rows if r["iteration"] == k]
            lines.append(line)
            report(line)
    finally:
        torch.set_num_threads(threads)
    return lines


def _iterations_done(folder: Path) -> int:
    """The last iteration whose state the live folder holds (0: none), the one a resume continues from."""
    from .grpo import loop

    if not (folder / "parts.json").is_file():
        return 0
    newest = loop.newest_state(RunFolder(folder))
    return 0 if newest is None else int(newest.name[5:8])


def _forget_older_states(folder: Path, k: int) -> None:
    """Keep only the newest state (about 11 MB each): the next iteration resumes from it."""
    run = RunFolder(folder)
    for name in list(run.ledger()["files"]):
        if name.startswith("states/iter-") and int(name[12:15]) < k:
            run.forget(name)


def format_line(line: dict) -> str:
    seconds = "  (earlier)" if line["seconds"] is None else f"{line['seconds']:6.1f} s"
    c = line["committed"]
    return (f"iteration {line['iteration']:3d}  reward {line['reward']:.4f}  no signal {line['frac_reward_zero_std']:.2f}  "
            f"{seconds}  |  committed: reward {c['reward']:.4f}  no signal {c['frac_reward_zero_std']:.2f}  "
            + ("agrees" if line["agrees"] else "DRIFTS (another CPU rounds differently)"))
