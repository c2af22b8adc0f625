"""Chapter 6, a GRPO run: `check_ch06_iteration_metrics` grades one iteration's logged metrics."""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function


CH06_KEYS = ("reward", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio")


def _ch06_rows(groups, order="grouped"):
    """Constructed rollout rows (not model outputs): groups = [(problem_id, [(reward, tokens, finish), ...])].

    Each response's text is a fixed 19-character answer whatever its token count, so a
    length counted in characters differs from one counted in tokens.  order "interleaved"
    deals the rows round-robin (first response of every group, then the second, ...).
    """
    per_group = []
    for problem_id, responses in groups:
        rows = []
        for j, (reward, tokens, finish) in enumerate(responses):
            rows.append({"rollout_id": f"constructed-{problem_id}-{j}", "iteration": 1, "problem_id": problem_id,
                         "response_ids": list(range(100, 100 + tokens)), "text": '{"final_stock": 43}',
                         "finish_reason": finish, "reward": float(reward)})
        per_group.append(rows)
    if order == "grouped":
        return [r for rows in per_group for r in rows]
    width = max(len(rows) for rows in per_group)
    return [rows[j] for j in range(width) for rows in per_group if j < len(rows)]


def _ch06_rewards_by_problem(rows) -> dict[str, list[float]]:
    """The iteration's groups: the rewards of the rows sharing a problem_id."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["problem_id"], []).append(float(r["reward"]))
    return groups


def _ch06_reference(rows) -> dict:
    """The logged metrics of one iteration, from its raw rollouts (groups = rows sharing a problem_id)."""
    groups = _ch06_rewards_by_problem(rows)
    return {
        "reward": sum(float(r["reward"]) for r in rows) / len(rows),
        "frac_reward_zero_std": sum(len(set(g)) == 1 for g in groups.values()) / len(groups),
        "completions/mean_length": sum(len(r["response_ids"]) for r in rows) / len(rows),
        "completions/clipped_ratio": sum(r["finish_reason"] == "length" for r in rows) / len(rows),
    }


def _ch06_variants(rows) -> dict:
    """The usual mistakes' answers, {(key, name): value}, to name the one a wrong answer matches."""
    n = len(rows)
    groups = _ch06_rewards_by_problem(rows)
    G = n // len(groups)
    chunks = [[float(r["reward"]) for r in rows[i:i + G]] for i in range(0, n, G)]
    right = _ch06_reference(rows)
    return {
        # checked in this order; case 1 (2 groups with signal, 3 all wrong, 1 all right) tells them all apart
        ("frac_reward_zero_std", "with signal"): 1.0 - right["frac_reward_zero_std"],
        ("frac_reward_zero_std", "all wrong only"): sum(set(g) == {0.0} for g in groups.values()) / len(groups),
        ("frac_reward_zero_std", "all right only"): sum(set(g) == {1.0} for g in groups.values()) / len(groups),
        ("frac_reward_zero_std", "consecutive chunks"): sum(len(set(c)) == 1 for c in chunks) / len(chunks),
        ("completions/mean_length", "characters"): sum(len(r["text"]) for r in rows) / n,
        ("completions/mean_length", "without EOS"): sum(len(r["response_ids"]) - 1 for r in rows) / n,
        ("completions/clipped_ratio", "reward 0"): sum(float(r["reward"]) == 0.0 for r in rows) / n,
        ("completions/clipped_ratio", "eos"): sum(r["finish_reason"] == "eos" for r in rows) / n,
        ("reward", "sum"): sum(float(r["reward"]) for r in rows),
    }


CH06_HINTS = {
    "all wrong only": ("an all-correct group [1, 1, 1, 1] has zero variance too: "
                       "count every group whose rewards are all equal"),
    "all right only": ("an all-wrong group [0, 0, 0, 0] has zero variance too: "
                       "count every group whose rewards are all equal"),
    "with signal": "that is the fraction of groups WITH signal; frac_reward_zero_std counts the constant groups",
    "consecutive chunks": ("a group is the G responses to one prompt: group the rows by problem_id, "
                           "not by consecutive chunks of rows"),
    "characters": "lengths are counted in tokens, len(response_ids), not in characters of the text",
    "without EOS": "the EOS token is part of the response (it is the last id of response_ids and it is scored)",
    "reward 0": ("clipped means cut at the token limit (finish_reason == 'length'), "
                 "not rewarded 0: most wrong answers ended with EOS"),
    "eos": "that is the fraction that ended with EOS; clipped_ratio counts finish_reason == 'length'",
    "sum": "the logged reward is the mean over the iteration's rollouts, not the sum",
}


def _ch06_cases():
    E, L = "eos", "length"
    return [
        ("six groups: two with signal, three all wrong, one all right; one response cut at the limit",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)]),
                     ("p5", [(0, 9, E), (0, 9, E), (0, 9, E), (0, 9, E)]),
                     ("p6", [(0, 11, E), (0, 7, E), (0, 8, E), (0, 9, E)])])),
        ("one group of each kind: [1,0,0,0], [0,0,0,0], [1,1,1,1], [1,1,0,0], one response cut at the limit",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)])])),
        ("every group all wrong",
         _ch06_rows([(f"p{k}", [(0, 5 + k, E)] * 4) for k in range(1, 5)])),
        ("the same groups as the first case, rows dealt round-robin (not grouped)",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)])], order="interleaved")),
        ("one all-right group and three all-wrong ones, rows dealt round-robin",
         _ch06_rows([("p1", [(1, 7, E)] * 4), ("p2", [(0, 9, E)] * 4), ("p3", [(0, 64, L)] * 4),
                     ("p4", [(0, 8, E)] * 4)], order="interleaved")),
        ("G = 2: four groups of two",
         _ch06_rows([("p1", [(1, 7, E), (0, 8, E)]), ("p2", [(1, 7, E), (1, 7, E)]),
                     ("p3", [(0, 64, L), (0, 9, E)]), ("p4", [(0, 6, E), (0, 6, E)])])),
    ]


def _ch06_compare(where: str, got, expected: dict, rows) -> None:
    if not isinstance(got, dict):
        raise ExerciseError(f"{where} returned {type(got).__name__}; return a dict with the keys {list(CH06_KEYS)}")
    missing = [k for k in CH06_KEYS if k not in got]
    if missing:
        raise ExerciseError(f"{where}: the returned dict lacks {missing}; it needs the keys {list(CH06_KEYS)} "
                            "(spelled as in history.json)")
    variants = _ch06_variants(rows)
    for key in CH06_KEYS:
        try:
            value = float(got[key])
        except (TypeError, ValueError):
            raise ExerciseError(f"{where}: {key!r} is {got[key]!r}; it must be a number") from None
        if abs(value - expected[key]) <= 1e-9:
            continue
        names = [name for (k, name), v in variants.items() if k == key and abs(value - v) <= 1e-9]
        hint = CH06_HINTS[names[0]] if names else {
            "reward": "the mean of the rewards of all the iteration's rollouts",
            "frac_reward_zero_std": "the fraction of groups (one per problem_id) whose G rewards are all equal",
            "completions/mean_length": "the mean over rollouts of len(response_ids)",
            "completions/clipped_ratio": "the fraction of rollouts with finish_reason == 'length'",
        }[key]
        raise ExerciseError(f"{where}: {key} = {value!r}, expected {expected[key]!r}. Hint: {hint}.")


def check_ch06_iteration_metrics(iteration_metrics, run_dir=None) -> bool:
    """Grade chapter 6's exercise: `iteration_metrics(rows) -> dict`, one iteration's logged metrics.

    rows: the raw rollouts of ONE iteration (dicts as in rollouts.jsonl.gz, in any order).
    The dict must hold reward (mean reward), frac_reward_zero_std (fraction of groups, one
    per problem_id, whose rewards are all equal), completions/mean_length (mean
    len(response_ids)) and completions/clipped_ratio (fraction with finish_reason
    "length").  Tried first on constructed iterations, then, when `run_dir` names a
    finished GRPO run, on every iteration of it against its history.json (within 1e-9).
    """
    from pathlib import Path

    require_function(iteration_metrics)

    def call(where, rows):
        return call_student(iteration_metrics, [dict(r) for r in rows], where=where)

    cases = _ch06_cases()
    for number, (what, rows) in enumerate(cases, start=1):
        where = f"constructed case {number} of {len(cases)} ({what})"
        _ch06_compare(where, call(where, rows), _ch06_reference(rows), rows)
    message = f"Correct: your iteration_metrics agrees on all {len(cases)} constructed iterations"
    if run_dir is not None:
        from ..grpo import read_rollouts
        from ..runs import read_json

        history = read_json(Path(run_dir) / "history.json")
        rollouts = read_rollouts(run_dir)
        for logged in history:
            rows = [r for r in rollouts if r["iteration"] == logged["iteration"]]
            where = f"iteration {logged['iteration']} of {Path(run_dir).name}"
            if not rows:
                raise ExerciseError(f"{run_dir} holds no rollouts of iteration {logged['iteration']}")
            expected = {k: logged[k] for k in CH06_KEYS}
            _ch06_compare(where + " (compared with history.json)", call(where, rows), expected, rows)
        message += f" and reproduces history.json on all {len(history)} iterations of {Path(run_dir).name}"
    print(message + ".")
    return True
