"""The cache fingerprints what the code does (labkit.lab.fingerprint): prose never makes a step stale,
an unused function neither, and a changed statement makes exactly the steps that run it stale.

First on a small hand-made package whose answers are worked out by hand, then on the whole lab in a
temporary copy (tests/prose_edits.py), then against what a real GRPO run executes.
"""

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from labkit import steps
from labkit.lab import cache
from labkit.lab.fingerprint import IMPORT_TIME, Sources, changed, strip_docstrings
from labkit.lab.runs import REPO_ROOT

sys.path.insert(0, str(Path(__file__).parent))
import prose_edits  # noqa: E402

PACKAGE = {
    "labkit/__init__.py": '"""The package."""\n',
    "labkit/maths.py": '''
        """Small maths."""
        import math
        from torch import nn as torch_nn

        SCALE = 2.0


        def double(x):
            """Twice x."""
            return SCALE * x  # why: the protocol's scale


        def unused(x):
            return math.sqrt(x)


        class Box:
            def __init__(self, v):
                self.v = torch_nn.Identity()(v)

            def get(self):
                return self.v
        ''',
    "labkit/run.py": '''
        """The entry point."""
        from . import maths
        from .maths import Box as Crate

        TABLE = {"double": maths.double}


        def main(x):
            from .late import helper

            return TABLE["double"](x) + helper(Crate(x).get())


        def other():
            return 0
        ''',
    "labkit/late.py": '''
        from . import maths

        print("imported")


        def helper(v):
            return v


        def whole():
            return maths
        ''',
}


def _write(root: Path, files: dict[str, str]) -> Sources:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return Sources.in_folder(root)


def test_what_an_entry_point_reaches_worked_out_by_hand(tmp_path):
    reached = _write(tmp_path, PACKAGE).reach(["labkit.run:main"])
    assert set(reached) == {
        "labkit.run:main", "labkit.run:TABLE", "labkit.run:<import>",  # the entry, the table it reads
        "labkit.maths:double", "labkit.maths:SCALE", "labkit.maths:<import>",  # through the table
        "labkit.maths:Box",  # through the re-export `Box as Crate`, with all its methods
        "labkit.late:helper", "labkit.late:<import>",  # the late import, and what late.py runs on import
    }  # not maths.unused, run.other or late.whole: nothing reached names them
    assert reached["labkit.maths:Box"] == ["torch_nn=torch.nn"]  # an outside name is digested as what it is
    assert reached["labkit.maths:<import>"] == []


def test_a_module_used_whole_brings_every_definition(tmp_path):
    reached = _write(tmp_path, PACKAGE).reach(["labkit.late:whole"])
    assert {"labkit.maths:unused", "labkit.maths:Box", "labkit.maths:SCALE"} <= set(reached)


def test_prose_and_unused_code_leave_the_fingerprint_and_a_statement_changes_exactly_its_symbol(tmp_path):
    before = _write(tmp_path / "a", PACKAGE).fingerprint(["labkit.run:main"])
    prose = dict(PACKAGE)
    prose["labkit/maths.py"] = (PACKAGE["labkit/maths.py"]
                                .replace('"""Twice x."""', '"""Two times x, reworded."""')
                                .replace("# why: the protocol's scale", "# another comment")
                                .replace("return SCALE * x", "return (\n                SCALE\n                * x)")
                                + "\n        def added_and_unused():\n            return 1\n")
    assert _write(tmp_path / "b", prose).fingerprint(["labkit.run:main"]) == before
    behaviour = dict(PACKAGE)
    behaviour["labkit/maths.py"] = PACKAGE["labkit/maths.py"].replace("return SCALE * x", "return SCALE * x + 0")
    after = _write(tmp_path / "c", behaviour).fingerprint(["labkit.run:main"])
    assert changed(before, after) == ["labkit.maths:double"]
    outside = dict(PACKAGE)
    outside["labkit/maths.py"] = PACKAGE["labkit/maths.py"].replace("from torch import nn", "from torch import fft")
    assert changed(before, _write(tmp_path / "d", outside).fingerprint(["labkit.run:main"])) == ["labkit.maths:Box"]


def test_a_module_imported_under_another_name_changes_no_digest(tmp_path):
    """`from . import maths as arithmetic` reads the same definitions as `from . import maths`: the digest
    writes each name as what it stands for, and a late import as the names it binds."""
    before = _write(tmp_path / "a", PACKAGE).fingerprint(["labkit.run:main"])
    aliased = dict(PACKAGE)
    aliased["labkit/run.py"] = (PACKAGE["labkit/run.py"]
                                .replace("from . import maths\n", "from . import maths as arithmetic\n")
                                .replace("maths.double", "arithmetic.double")
                                .replace("from .maths import Box as Crate", "from .maths import Box")
                                .replace("Crate(x)", "Box(x)")
                                .replace("from .late import helper\n", "from . import late\n")
                                .replace("helper(Box", "late.helper(Box"))
    assert _write(tmp_path / "b", aliased).fingerprint(["labkit.run:main"]) == before
    local = dict(PACKAGE)  # a local variable that shadows a module-level name is the function's own
    local["labkit/run.py"] = PACKAGE["labkit/run.py"].replace("def other():\n            return 0",
                                                              "def other():\n            maths = 0\n            return maths")
    assert "labkit.maths:unused" not in _write(tmp_path / "c", local).reach(["labkit.run:other"])


def test_an_unknown_entry_point_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="'labkit.run:mian'"):
        _write(tmp_path, PACKAGE).reach(["labkit.run:mian"])


def test_docstrings_go_and_an_empty_body_stays_valid():
    import ast

    tree = strip_docstrings(ast.parse('def f():\n    """Only a docstring."""\n'))
    assert ast.dump(tree) == ast.dump(ast.parse("def f():\n    pass\n"))


# -- The whole lab ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def edited_copy(tmp_path_factory):
    """A copy of the repository's code and data with every labkit module edited as prose."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(REPO_ROOT / "labkit", root / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "data", root / "data")
    edited = prose_edits.edit_package(root)
    assert len(edited) == len(list((REPO_ROOT / "labkit").rglob("*.py")))
    return root


@pytest.mark.slow  # a copy of the package, every module edited: 22 s in a loaded unit phase: `make test-slow`
def test_prose_edits_in_every_module_leave_every_step_fresh(edited_copy):
    verdicts = cache.check(steps.STEPS, "tiny", code_root=edited_copy)
    assert {name: v["status"] for name, v in verdicts.items()} == {name: "fresh" for name in steps.STEP_NAMES}, \
        cache.format_check(verdicts)


def test_a_function_added_to_every_module_changes_nothing(edited_copy, tmp_path):
    root = tmp_path / "lab"
    shutil.copytree(edited_copy, root)
    for path in (root / "labkit").rglob("*.py"):
        path.write_text(path.read_text() + "\n\ndef added_and_unused(x):\n    return x + 1\n")
    verdicts = cache.check(steps.STEPS, "tiny", code_root=root)
    assert all(v["status"] == "fresh" for v in verdicts.values()), cache.format_check(verdicts)


@pytest.mark.parametrize("module, old, new, stale, rebuilt", [
    # chapters 2-3's study alone runs it
    ("studies/gradient_study.py", "def batch_gradients(", None, {"gradient_study"}, ["gradient_study"]),
    # the thinking bases' builder: chapter 11's GRPO runs and its skill test are built from its outputs
    ("studies/thinking_base.py", "def run_all(", None, {"thinking"}, ["thinking", "reasoning", "skill_test", "crossover"]),
    # the clipped surrogate: every step that trains with GRPO, and what is built from them
    ("grpo/losses.py", "def clipped_surrogate(", None,
     {"grpo", "group_size", "grpo_large", "overoptimisation", "gradient_study", "reasoning", "rarer"},
     ["grpo", "evaluation", "group_size", "grpo_large", "overoptimisation", "gradient_study", "reasoning",
      "crossover", "rarer"]),
])
def test_a_changed_statement_makes_exactly_the_steps_that_run_it_stale(edited_copy, tmp_path, module, old, new,
                                                                       stale, rebuilt):
    root = tmp_path / "lab"
    shutil.copytree(edited_copy, root)
    path = root / "labkit" / module
    text = path.read_text()
    start = text.index(old)
    body = text.index("\n", text.index("):", start)) + 1  # the line after the signature (docstring or not)
    indent = " " * (len(text[body:]) - len(text[body:].lstrip(" ")))
    path.write_text(text[:body] + f"{indent}_unused_local = 1\n" + text[body:])
    verdicts = cache.check(steps.STEPS, "tiny", code_root=root)
    assert {n for n, v in verdicts.items() if v["status"] == "stale"} == stale, cache.format_check(verdicts)
    symbol = f"labkit.{module[:-3].replace('/', '.')}:{old[4:-1]}"
    assert all(v["changed"] == [f"code {symbol}"] for n, v in verdicts.items() if n in stale)
    assert cache.to_rebuild(steps.STEPS, verdicts) == rebuilt


def test_the_committed_cache_is_fingerprinted_and_says_where_it_came_from():
    record = cache.read_cache("tiny")
    assert set(record) == set(steps.STEP_NAMES)
    for name, entry in record.items():
        assert not cache.is_byte_record(entry), name
        assert entry["code"], name


# -- Against what really runs ---------------------------------------------------------------------------

@pytest.mark.slow  # a traced GRPO run: 24 s in a loaded unit phase: `make test-slow`
def test_every_function_a_grpo_run_executes_is_in_its_fingerprint(tmp_path):
    """The static reach is a superset of what runs: every labkit function a short real GRPO run (and its
    resume) executes is in the grpo step's fingerprint."""
    from labkit.config import TINY
    from labkit.grpo import loop
    from labkit.models import presets

    start = tmp_path / "start.safetensors"
    presets.save_model(presets.new_tiny_model(seed=3), start)
    config = TINY.with_overrides(max_new_tokens=4, checkpoint_every=1, checkpoint_problems=2)
    ran = set()
    labkit_dir = str(REPO_ROOT / "labkit")

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(labkit_dir):
            rel = Path(code.co_filename).relative_to(REPO_ROOT).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            top = code.co_qualname.split(".")[0]
            ran.add(f"{module}:{IMPORT_TIME if top == '<module>' else top}")

    sys.setprofile(profile)
    try:
        loop.run_grpo(config, tmp_path / "run", G=2, iterations=2, start_file=start, progress=False,
                      save_states_at=(1,))
        loop.run_grpo(config, tmp_path / "resumed", G=2, iterations=2, start_file=start, progress=False,
                      stop_after=1)
        loop.run_grpo(config, tmp_path / "resumed", G=2, iterations=2, start_file=start, progress=False,
                      resume=True)
    finally:
        sys.setprofile(None)
    reached = set(cache.code_fingerprint(steps.get_step("grpo"), Sources.in_folder(REPO_ROOT)))
    ran = {k for k in ran if not k.endswith(f":{IMPORT_TIME}") and not k.startswith("labkit.lab.fingerprint")}
    assert len(ran) > 50
    assert ran - reached == set()


def test_a_damaged_file_is_named_as_damaged_and_the_steps_built_from_it_stay_fresh(tmp_path, monkeypatch):
    """A flipped byte in the warm start's model: the warm start is damaged (restore the file), not eight later
    steps stale (issue 58, item 10)."""
    runs = tmp_path / "tiny"
    shutil.copytree(REPO_ROOT / "runs" / "tiny", runs, ignore=shutil.ignore_patterns("stale", "fill", "sweep"))
    model = runs / "warm_start" / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 1
    model.write_bytes(bytes(data))
    monkeypatch.setattr(cache, "runs_dir", lambda preset: runs)
    verdicts = cache.check(steps.STEPS, "tiny")
    assert verdicts["warm_start"]["status"] == "damaged"
    assert [p.endswith("tiny/warm_start/model.safetensors") for p in verdicts["warm_start"]["changed"]] == [True]
    assert {n: v["status"] for n, v in verdicts.items() if n != "warm_start"} == \
        {n: "fresh" for n in steps.STEP_NAMES if n != "warm_start"}, cache.format_check(verdicts)
    assert cache.to_rebuild(steps.STEPS, verdicts) == []  # restored, not rebuilt


def test_the_sweeps_remembered_code_digest_is_the_one_computed(tmp_path, monkeypatch):
    """sweep.code_digest remembers its digest under the SHA-256 of every source's bytes: what it reads back is
    what the fingerprint computes from the same sources."""
    import tempfile

    from labkit.lab.fingerprint import digest_of
    from labkit.studies import sweep

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    computed = digest_of(Sources.in_folder(REPO_ROOT).fingerprint([sweep.RUN_ENTRY]))
    assert sweep._remembered_digest(lambda: computed) == computed  # computed, then written
    assert sweep._remembered_digest(lambda: "never asked") == computed  # read back
    (memo,) = (tmp_path / "labkit-code-digest").iterdir()
    memo.write_text("damaged\n")
    assert sweep._remembered_digest(lambda: computed) == computed  # a damaged memo is computed again
