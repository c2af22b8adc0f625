"""One name per quantity, in the code, the chapters and the glossary (issue 42): the names below are retired
and the test fails on the line that brings one back.  The module, the cached step and the run folder of
the group-size exercise keep their name (`labkit/studies/group_size.py`, runs/<preset>/group_size/):
they name the exercise, not the quantity G."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RETIRED = {
    "old_logprobs": "logp_old (the log-probs recorded at sampling time)",
    "group_size": "G (responses per prompt)",
    "max_response_tokens": "max_new_tokens (the response limit)",
    "MAX_RESPONSE_TOKENS": "scoring.MAX_NEW_TOKENS (the protocol's response limit)",
    "zero_signal_fraction": "losses.expected_frac_reward_zero_std (the expected share of groups with no signal)",
    "signal_fraction": "1 - losses.expected_frac_reward_zero_std",
    "constant_groups": "zero-variance groups (losses.zero_variance_groups; their share is frac_reward_zero_std)",
}
# where "group_size" names the exercise (its module, its cached step, its command, its folder), a line is spared
EXERCISE = re.compile(r"studies[./]group_size|import group_size|group_size as gs|group_size\.[a-z_]+\(|"
                      r"Step\(\"group_size\"|then=\(\"group_size\"|\"step\": \"group_size\"|group-size|group_size/|"
                      r"runs/[^/ ]+/group_size|/ \"group_size\"|preset_folder\(preset, \"group_size\"|"
                      r"\"evaluation\", \"group_size\"\)|\"group_size\": (?:lambda|\"group_size\")|"
                      r"labkit\.studies\s+ablations, group_size,")  # labkit/__init__.py's table of modules


def sources() -> list[tuple[str, str]]:
    """(name, text) of the package's modules, the chapters' cells and the glossary."""
    out = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "labkit").rglob("*.py"))]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        out += [(f"{path.relative_to(ROOT)} cell {i}", "".join(c["source"])) for i, c in enumerate(cells)]
    return out + [("book/glossary.md", (ROOT / "book" / "glossary.md").read_text())]


def found(name: str, text: str) -> list[int]:
    """Lines of `text` where the retired `name` appears as a whole word, outside the exercise's own name."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(rf"\b{name}\b", line) and not (name == "group_size" and EXERCISE.search(line)):
            lines.append(number)
    return lines


def test_the_finder_sees_a_retired_name_and_spares_the_exercises_own():
    assert found("group_size", "loss = reduce(values, mask, group_size=4)") == [1]
    assert found("group_size", "from labkit.studies import group_size as gs\nout = root / \"group_size\"") == []
    assert found("old_logprobs", "x = r.logp_old\ny = r.old_logprobs") == [2]


@pytest.mark.parametrize("name", sorted(RETIRED))
def test_a_retired_name_stays_retired(name):
    where = {source: lines for source, text in sources() if (lines := found(name, text))}
    assert where == {}, f"{name!r} is retired, use {RETIRED[name]}: {where}"
