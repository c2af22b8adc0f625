"""Run GRPO yourself, live, and watch it agree with the committed run (issue 55, item 4; chapters 6 and 11).

    python -m labkit live grpo [--iterations 10]        or, in a notebook, `live_grpo(10, on_iteration=...)`
    python -m labkit live reasoning [--base rare_2] [--iterations 20] [--group-size 8] [--beta 0.02]
                                                        or `live_reasoning(20, base="rare_2", on_iteration=...)`

`live_reasoning` (at the end of this file) is chapter 11's GRPO from a thinking base, the run itself
(`labkit.studies.reasoning.train`, the lab's one GRPO loop) with a line per iteration: the share of
responses that work the problem out, their mean length, the share right, the seconds, beside the
committed run's same iteration and "agrees" where the responses are its responses, text for text.
Another base, G or beta gives a run of your own (no committed run to compare).  A Ctrl-C finishes the
iteration and saves its state; the same call goes on from there.  What follows is the protocol's.

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

from .lab import skeleton
from .lab.runs import REPO_ROOT, RunFolder, display_path, preset_folder, read_checked_json

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


# -- Chapter 11: RL that teaches the tiny model to work a problem out, live -----------------------------

REASONING_DIR = REPO_ROOT / "runs" / "scratch" / "live" / "reasoning"
REASONING_FIGURES = ("think_rate", "mean_tokens", "accuracy")


def live_reasoning(iterations: int = 20, *, base: str = "rare_2", G: int | None = None, kl_coef: float | None = None,
                   preset: str = "tiny", run_dir: str | Path | None = None, on_iteration=None,
                   restart: bool = False) -> list[dict]:
    """Iterations 1..`iterations` of chapter 11's GRPO from the thinking base `base`, with the committed run's
    settings and seeds unless G or kl_coef (beta) say otherwise; each iteration compared with the committed
    run's same iteration where the settings are the committed ones.

    The run is chapter 11's own (`labkit.studies.reasoning.train`, the lab's one GRPO loop), into
    runs/scratch/live/reasoning/<base>-G<G>-beta<beta>/: a Ctrl-C finishes the iteration, saves its state
    and stops with a line saying so (no traceback); calling again with the same settings goes on from there
    (restart: begin again at 1).
    on_iteration(line): after each iteration, {"iteration", "think_rate", "mean_tokens", "accuracy",
    "seconds", "committed": {...} or None, "agrees"} (a notebook redraws its figure there); default: print
    the line.  Returns every line of this call."""
    import dataclasses

    import torch

    from .config import ReasoningConfig, TINY
    from .grpo import loop
    from .studies import reasoning

    outcome_runs = {r.base: r.name for r in reasoning.RUNS if r.reward == "outcome" and not r.length_penalty}
    name = outcome_runs.get(base)
    if name is None:
        raise ValueError(f"base {base!r}: chapter 11's outcome runs start from {', '.join(outcome_runs)}")
    cfg = ReasoningConfig() if G is None else dataclasses.replace(ReasoningConfig(), G=G)
    beta = TINY.kl_coef if kl_coef is None else kl_coef
    if isinstance(iterations, bool) or not isinstance(iterations, int) or not 1 <= iterations <= cfg.iterations:
        raise ValueError(f"iterations {iterations!r}: must be an integer in 1..{cfg.iterations} (the committed runs')")
    if cfg.G < 2 or not beta >= 0:
        raise ValueError(f"G {cfg.G}, beta {beta}: a group needs G >= 2, and beta is a KL weight >= 0")
    committed_dir = reasoning.default_run_dir(preset, name)
    ours = cfg == ReasoningConfig() and beta == TINY.kl_coef and (committed_dir / "FINISHED").is_file()
    committed = loop.read_rollouts(committed_dir) if ours else []
    history = read_checked_json(committed_dir / "history.json") if ours else []
    folder = Path(run_dir or REASONING_DIR / f"{base}-G{cfg.G}-beta{beta:g}")
    if restart and folder.exists():
        import shutil

        shutil.rmtree(folder)
    done = _iterations_done(folder)
    report = on_iteration or (lambda line: print(format_reasoning_line(line), flush=True))
    lines, clock = [], [time.perf_counter()]

    def compared(k: int, figures: dict, rows: list[dict], seconds: float | None) -> dict:
        return {"iteration": k, **figures, "seconds": seconds,
                "committed": {key: history[k - 1][key] for key in REASONING_FIGURES} if ours else None,
                # agreement is the responses themselves, every text and its length in tokens, not only the
                # shares they make (chapter 11's rows keep no token ids)
                "agrees": ours and [(r["text"], r["tokens"]) for r in rows] == [
                    (r["text"], r["tokens"]) for r in committed if r["iteration"] == k]}

    if done:  # iterations an earlier call ran: read back, not run again
        earlier = loop.read_rollouts(folder)
        for k in range(1, min(done, iterations) + 1):
            rows = [r for r in earlier if r["iteration"] == k]
            lines.append(compared(k, reasoning.iteration_figures(rows), rows, None))
            report(lines[-1])

    def record(loop_, iteration, sampled, updates, check):
        out = reasoning.record(loop_, iteration, sampled, updates, check)
        lines.append(compared(iteration + 1, reasoning.iteration_figures(out[1]), out[1],
                              time.perf_counter() - clock[0]))
        report(lines[-1])
        clock[0] = time.perf_counter()
        return out

    if done >= iterations:
        return lines
    threads = torch.get_num_threads()
    if ours:  # the committed run's threads, so that it can agree
        torch.set_num_threads(RunFolder(committed_dir).manifest()["environment"]["torch_threads"])
    run = reasoning.get_run(name)
    task = dataclasses.replace(reasoning.worked_task(run, cfg), record=record)
    try:
        reasoning.train(name, preset, cfg, run_dir=folder, resume=done > 0, stop_after=iterations, progress=False,
                        kl_coef=beta, task=task)
    except skeleton.Interrupted:  # the loop finished the iteration and saved its state before it stopped
        last = lines[-1]["iteration"] if lines else done
        print(f"Ctrl-C: stopped after iteration {last}, its state saved in {display_path(folder)}; run the same "
              "cell (or command) again to go on from there", flush=True)
    finally:
        torch.set_num_threads(threads)
    return lines


def format_reasoning_line(line: dict) -> str:
    seconds = "  (earlier)" if line["seconds"] is None else f"{line['seconds']:5.1f} s"
    figures = (f"iteration {line['iteration']:3d}  thinks {line['think_rate']:6.1%}  tokens {line['mean_tokens']:5.1f}  "
               f"right {line['accuracy']:6.1%}  {seconds}")
    c = line["committed"]
    if c is None:
        return figures + "  |  your settings: no committed run to compare"
    return (figures + f"  |  committed: thinks {c['think_rate']:6.1%}  tokens {c['mean_tokens']:5.1f}  "
            f"right {c['accuracy']:6.1%}  " + ("agrees" if line["agrees"] else "DRIFTS (another CPU rounds differently)"))
