r"""A student reads each chapter in one sitting, and no page points at a section or figure that is not there.

The student's path through a chapter is every one of its cells: the folded instructor boxes are
counted too, so that the bound holds however a reader opens the notebook.  Its prose is the
markdown cells' text, every run of word characters (`\w+`) counted, maths and code spans included:
the strictest of the usual counts.  The limits (issue 44): at most 3,000 words and 45 cells per
chapter, at most 1,500 words on the results page.

References: "section 6.15", "sections 3.4 and 3.5", "Figure 2.1", "Table 9.1" must each name a
numbered heading, figure or table that exists (a heading `## 6.15 ...`, a caption or label
"Figure 2.1" / "Table 9.1" somewhere in the chapter's cells or outputs).

`python tests/test_reading_length.py` prints every chapter's counts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PAGES = sorted((ROOT / "book").glob("*.md"))
MAX_WORDS, MAX_CELLS, MAX_RESULTS_WORDS = 3000, 45, 1500

_WORD = re.compile(r"\w+")


def prose_words(markdown: str) -> int:
    """The number of words in one markdown text: runs of word characters (the rule in the module docstring)."""
    return len(_WORD.findall(markdown))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    source = cell["source"]
    return source if isinstance(source, str) else "".join(source)


def student_path(path: Path) -> tuple[int, int]:
    """(words of markdown prose, cells) of a chapter: every cell counts (the rule in the module docstring)."""
    cells = _cells(path)
    words = sum(prose_words(_source(c)) for c in cells if c["cell_type"] == "markdown")
    return words, len(cells)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_is_one_sitting(path):
    words, cells = student_path(path)
    assert words <= MAX_WORDS, f"{path.name}: {words} words of prose on the student's path, the limit is {MAX_WORDS}"
    assert cells <= MAX_CELLS, f"{path.name}: {cells} cells on the student's path, the limit is {MAX_CELLS}"


def test_the_results_page_reads_in_two_minutes():
    words = prose_words((ROOT / "book" / "results.md").read_text(encoding="utf-8"))
    assert words <= MAX_RESULTS_WORDS, f"book/results.md: {words} words, the limit is {MAX_RESULTS_WORDS}"


def test_the_counting_rule_on_a_hand_made_text():
    text = "Two words.\n\n```python\nx = y\n```\n$$a + b$$ `rho_it` don't"
    assert prose_words(text) == 10  # Two words python x y a b rho_it don t


# ------------------------------------------------------------------ references

_REFERENCE = re.compile(r"\b(sections?|§|figures?|tables?)\s+((?:\d+\.\d+)(?:(?:,\s*|\s+and\s+|\s*[-–]\s*)\d+\.\d+)*)",
                        re.IGNORECASE)
_NUMBER = re.compile(r"\d+\.\d+")
_HEADING = re.compile(r"^#{2,6}\s+(\d+\.\d+)\b", re.MULTILINE)
_LABEL = re.compile(r"\b(Figure|Table)\s+(\d+\.\d+)\b")


def _chapter_texts(path: Path) -> list[str]:
    """Every text a chapter shows: its cells' sources and their text outputs."""
    texts = []
    for cell in _cells(path):
        texts.append(_source(cell))
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain") or ""
            texts.append(text if isinstance(text, str) else "".join(text))
            md = output.get("data", {}).get("text/markdown") or ""
            texts.append(md if isinstance(md, str) else "".join(md))
    return texts


def targets() -> dict[str, set[str]]:
    """What exists: section numbers (headings), and figure and table numbers (any mention as a label)."""
    found = {"section": set(), "figure": set(), "table": set()}
    for path in CHAPTERS:
        for text in _chapter_texts(path):
            found["section"].update(_HEADING.findall(text))
    # A figure or table exists when its chapter shows it with a caption: "**Figure 6.2.**", "Figure 6.2:",
    # or a plot title "Figure 6.2 ...".  Every mention in the chapter whose number it is counts as its caption.
    for path in CHAPTERS:
        chapter = path.name[:2].lstrip("0")
        for text in _chapter_texts(path):
            for kind, number in _LABEL.findall(text):
                if number.split(".")[0] == chapter:
                    found[kind.lower()].add(number)
    return found


def dangling_references(text: str, found: dict[str, set[str]]) -> list[str]:
    """The references in `text` that name a section, figure or table not in `found`."""
    missing = []
    for match in _REFERENCE.finditer(text):
        word = match.group(1).lower()
        kind = "section" if word.startswith(("section", "§")) else "figure" if word.startswith("fig") else "table"
        for number in _NUMBER.findall(match.group(2)):
            if number not in found[kind]:
                missing.append(f"{kind} {number}")
    return missing


def test_every_section_figure_and_table_reference_exists():
    found = targets()
    problems = []
    for path in CHAPTERS:
        for text in _chapter_texts(path):
            problems += [f"{path.name}: {m}" for m in dangling_references(text, found)]
    for path in PAGES:
        problems += [f"{path.name}: {m}" for m in dangling_references(path.read_text(encoding="utf-8"), found)]
    assert not problems, "references to nothing: " + "; ".join(sorted(set(problems)))


def test_the_reference_check_finds_a_dangling_reference():
    found = {"section": {"6.15"}, "figure": {"2.1"}, "table": set()}
    assert dangling_references("see section 6.15 and Figure 2.1", found) == []
    assert dangling_references("see section 6.14, Figure 2.2 and Table 9.1", found) == [
        "section 6.14", "figure 2.2", "table 9.1"]
    assert dangling_references("sections 6.14 and 6.15", found) == ["section 6.14"]


if __name__ == "__main__":
    for chapter in CHAPTERS:
        print(f"{chapter.name:32} words {student_path(chapter)[0]:5}  cells {student_path(chapter)[1]:3}")
    print(f"{'book/results.md':32} words {prose_words((ROOT / 'book' / 'results.md').read_text()):5}")
    found = targets()
    for path in [*CHAPTERS, *PAGES]:
        texts = _chapter_texts(path) if path.suffix == ".ipynb" else [path.read_text()]
        for text in texts:
            for m in dangling_references(text, found):
                print(f"dangling: {path.name}: {m}")


_CAPTION = re.compile(r"\*\*Figure (\d+\.\d+)(?:\.\*\*|\*\* \(in the answer above\):)")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_figures_are_cited_in_order_and_each_has_a_caption(path):
    """Issue 57: Figure 2.3 was cited before 2.2, and the predict-then-run figures had no caption."""
    text = "\n".join(_source(c) for c in _cells(path))
    first_cited = list(dict.fromkeys(re.findall(r"Figure (\d+\.\d+)", text)))
    numbers = [tuple(int(x) for x in n.split(".")) for n in first_cited]
    assert numbers == sorted(numbers), f"{path.name}: figures first cited in the order {first_cited}"
    captioned = set(_CAPTION.findall(text))
    assert set(first_cited) <= captioned, f"{path.name}: no caption for {sorted(set(first_cited) - captioned)}"
