"""The book's tools: the offline check of the built HTML, and the generated results page.

`find_external_assets(html_dir)` lists every script, style sheet, font, image
or frame that a built page or style sheet would fetch from another host (a CDN,
Google Fonts, ...).  Links a reader may click (`<a href="https://...">`, the
Colab and Binder launch buttons) are not assets and are allowed.

Run after `jupyter-book build`:  python -m labkit.book.build check-offline _build/html

`python -m labkit.book.build student-sources DIR` assembles the student book's sources (the pages and
the student copies of the chapters); `check-student HTML_DIR` fails if a solution reached it.

`python -m labkit.book.build execute` re-runs every chapter and stores its outputs (after
`make cache`); `python -m labkit.book.build results-page [--run runs/qwen]` writes `book/results.md` from a
run's files (labkit.book.results_page); `--check` says whether the page is current.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

from ..lab.runs import REPO_ROOT, atomic_write_text

# Attributes through which an element makes the browser fetch something.
_FETCHING_ATTRS = {
    "script": ("src",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "source": ("src", "srcset"),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
    "input": ("src",),
}
# <link rel=...> values that fetch a resource; others (canonical, alternate, next, prev) are only metadata.
_FETCHING_LINK_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut",
                       "apple-touch-icon", "manifest", "dns-prefetch", "preconnect"}
_EXTERNAL = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
# url(...) and @import "..." in CSS, both in .css files and in <style> / style="" of pages.
_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)


def is_external(url: str) -> bool:
    """True for an absolute http(s) or protocol-relative URL: one that leaves the book."""
    return bool(_EXTERNAL.match(url))


def _external_css_urls(css: str) -> list[str]:
    return [u for m in _CSS_URL.finditer(css) for u in m.groups() if u and is_external(u)]


class _AssetCollector(HTMLParser):
    """Collects the external URLs a page would fetch while it loads."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.external: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        attrs = {k: (v or "") for k, v in attrs}
        if tag == "style":
            self._in_style = True
        if "style" in attrs:
            self.external += _external_css_urls(attrs["style"])
        if tag == "link":
            rels = set(attrs.get("rel", "").lower().split())
            if rels & _FETCHING_LINK_RELS and is_external(attrs.get("href", "")):
                self.external.append(attrs["href"])
            return
        for name in _FETCHING_ATTRS.get(tag, ()):
            value = attrs.get(name, "")
            # srcset holds "url 2x, url 1x": every candidate counts.
            candidates = [part.split()[0] for part in value.split(",") if part.strip()] if name == "srcset" else [value]
            self.external += [u for u in candidates if is_external(u)]

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.external += _external_css_urls(data)


def find_external_assets(html_dir: str | Path) -> dict[str, list[str]]:
    """{file relative to html_dir: [external URLs it would fetch]} for pages and style sheets.

    Files with nothing external are left out, so an empty dict means the book is
    self-contained.  Raises FileNotFoundError when html_dir has no index.html
    (the book was not built there).
    """
    root = Path(html_dir)
    if not (root / "index.html").is_file():
        raise FileNotFoundError(f"{root} has no index.html: build the book first (make book)")
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.html")) + sorted(root.rglob("*.css")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".css":
            urls = _external_css_urls(text)
        else:
            collector = _AssetCollector()
            collector.feed(text)
            urls = collector.external
        if urls:
            found[path.relative_to(root).as_posix()] = sorted(set(urls))
    return found


def book_pages(html_dir: str | Path) -> list[str]:
    """The pages a reader can open, relative to html_dir (theme templates in _static left out)."""
    root = Path(html_dir)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html")
                  if p.relative_to(root).parts[0] not in ("_static", "_sources", "_images"))


def coalesce_streams(outputs: list) -> list:
    """Consecutive outputs of one stream (stdout, stderr) merged into one: how a kernel chunks a cell's
    prints depends on timing (a loaded machine splits them more), so the stored notebook would change
    from run to run without this; nbval compares them merged too."""
    merged = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == out.get("name")):
            merged[-1]["text"] = merged[-1]["text"] + out["text"]
        else:
            merged.append(out)
    return merged


def execute_notebook(path: str | Path, timeout: int = 600) -> float:
    """Run a notebook top to bottom in a fresh kernel (cwd: its folder) and store its outputs; returns seconds.

    Execution timestamps are not stored and a stream's chunks are merged (`coalesce_streams`), so a
    re-run changes a notebook only where its outputs changed.  A cell that raises stops the run and
    nothing is written.
    """
    import time

    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    os.environ["LABKIT_KNOBS"] = "0"  # the knobs store their static figure, never a widget (labkit.book.knobs)
    os.environ["LABKIT_LIVE"] = "0"  # a live run's cell stores its skip line, never a run (labkit.live)
    started = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = coalesce_streams(cell.outputs)
    text = nbformat.writes(nb)
    atomic_write_text(path, text if text.endswith("\n") else text + "\n")
    return time.perf_counter() - started


BOOK_FILES = ("_config.yml", "_toc.yml", "book")


def write_student_sources(out_dir: str | Path) -> Path:
    """The student book's sources in out_dir: the instructor's pages, the chapters as student copies.

    out_dir is rebuilt from scratch (it is a build folder; it may not be the repository).
    The offline MathJax is linked from the instructor's `_build/offline`.
    """
    import shutil

    from . import student

    out_dir = Path(out_dir).resolve()
    if out_dir == REPO_ROOT or REPO_ROOT.is_relative_to(out_dir):
        raise ValueError(f"refusing to rebuild {out_dir}: the student book's sources go in a build folder")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for name in BOOK_FILES:
        source = REPO_ROOT / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, out_dir / name)
    config = (out_dir / "_config.yml").read_text(encoding="utf-8")
    title = re.search(r'^title: "(.*)"$', config, re.MULTILINE)
    if title is None:
        raise ValueError("_config.yml has no `title: \"...\"` line to mark as the student edition")
    config = config.replace(title.group(0), f'title: "{title.group(1)} (student edition)"')
    atomic_write_text(out_dir / "_config.yml", config)
    student.write_student_copies(out_dir / "notebooks")
    (out_dir / "_build").mkdir()
    (out_dir / "_build" / "offline").symlink_to(REPO_ROOT / "_build" / "offline", target_is_directory=True)
    return out_dir


class _TextCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)


def page_text(path: Path) -> str:
    """A page's text with all whitespace collapsed to single spaces (code spans joined)."""
    collector = _TextCollector()
    collector.feed(path.read_text(encoding="utf-8", errors="replace"))
    return " ".join("".join(collector.parts).split())


def solution_lines(source: str) -> list[str]:
    """The lines of a solution cell that give the answer away (not its signature, docstring or comments)."""
    import ast

    body_docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                body_docstrings.update(" ".join(line.split()) for line in doc.splitlines())
    lines = []
    for line in source.splitlines():
        text = " ".join(line.split("#")[0].split())
        if (len(text) < 12 or text.startswith(("def ", "class ", "import ", "from ", '"""', "@"))
                or text in body_docstrings or text.strip('"') in body_docstrings):
            continue
        lines.append(text)
    return lines


def _output_text(cell) -> str:
    """The text a code cell's stored outputs show (streams and text/plain)."""
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else text)
    return " ".join(parts)


def student_book_leaks(student_html: str | Path, instructor_html: str | Path | None = None) -> list[str]:
    """'page: line' for every solution line found in the student book (empty list: none leaked).

    With instructor_html, every solution must also be found in the instructor's book (or the
    check could not see a leak), else ValueError.
    """
    import nbformat

    from . import student

    found = []
    for nb_path in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        page = Path("notebooks") / (nb_path.stem + ".html")
        solutions = [c for c in nb.cells if student.SOLUTION_TAG in student.tags(c)]
        # A line that other cells also show (a generic `return False`) says nothing of a leak.
        # (markdown is compared as it reads: without its code and emphasis marks)
        elsewhere = " ".join(" ".join(re.sub(r"[`*]", "", c.source).split() + _output_text(c).split())
                             for c in nb.cells if c not in solutions)
        lines = [line for cell in solutions for line in solution_lines(cell.source) if line not in elsewhere]
        if not lines:
            continue
        if instructor_html is not None:
            shown = page_text(Path(instructor_html) / page)
            missing = [line for line in lines if line not in shown]
            if missing:
                raise ValueError(f"{page}: the instructor's book does not show the solution line {missing[0]!r}; "
                                 "the student-book check cannot see leaks of it")
        text = page_text(Path(student_html) / page)
        found += [f"{page}: {line}" for line in lines if line in text]
    return found


def build_parser() -> argparse.ArgumentParser:
    """The commands of `python -m labkit.book.build`."""
    parser = argparse.ArgumentParser(
        prog="python -m labkit.book.build", description=__doc__.split("\n\n")[0],
        epilog="These tools work on the book, from the files the lab's runs wrote; the protocol's steps "
               "(data, training, evaluation, the cache) are `python -m labkit --help`.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check-offline", help="fail if a built page or style sheet fetches from another host")
    p.add_argument("html_dir", nargs="?", default="_build/html")
    p = sub.add_parser("results-page", help="write book/results.md from a run's results files (default: the tiny cache)")
    p.add_argument("--run", default=None, help="run folder holding evaluation/results.json (default: runs/tiny)")
    p.add_argument("--out", default=None, help="page to write (default: book/results.md)")
    p.add_argument("--check", action="store_true", help="only check that the page is what the run gives now")
    p = sub.add_parser("execute", help="re-execute chapter notebooks in place and store their outputs "
                                       "(after the cache changed)")
    p.add_argument("notebooks", nargs="*", type=Path,
                   help="notebooks (default: every notebooks/*.ipynb, the chapters and the appendix)")
    p = sub.add_parser("student-sources", help="assemble the student book's sources (student copies of the chapters)")
    p.add_argument("out_dir", help="build folder to (re)create, e.g. _build/student_src")
    p = sub.add_parser("check-student", help="fail if any exercise solution appears in the built student book")
    p.add_argument("html_dir", help="the student book's HTML, e.g. _build/student_src/_build/html")
    p.add_argument("--instructor", default="_build/html", help="the instructor's HTML (default: %(default)s), "
                   "where every solution must be found")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command; a bad input (a missing or damaged file, a bad value) is one line on stderr and exit 2
    (`labkit.lab.errors.refused`, as for `python -m labkit`)."""
    from ..lab.errors import refused

    args = build_parser().parse_args(argv)
    return refused(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:

    if args.command == "student-sources":
        print(f"wrote the student book's sources into {write_student_sources(args.out_dir)}")
        return 0
    if args.command == "check-student":
        leaks = student_book_leaks(args.html_dir, args.instructor)
        for leak in leaks:
            print(f"solution in the student book: {leak}", file=sys.stderr)
        if leaks:
            return 1
        print(f"student book {args.html_dir}: no solution line found (each one is in {args.instructor})")
        return 0

    if args.command == "execute":
        for path in args.notebooks or sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
            print(f"executed {path} in {execute_notebook(path):.1f} s", flush=True)
        return 0
    if args.command == "results-page":
        from . import results_page

        run = args.run or results_page.DEFAULT_RUN
        out = args.out or results_page.DEFAULT_OUT
        if args.check:
            if results_page.is_current(run, out):
                print(f"{out} is current with {run}")
                return 0
            print(f"{out} is out of date with {run}: run `python -m labkit.book.build results-page`", file=sys.stderr)
            return 1
        print(f"wrote {results_page.write(run, out)}")
        return 0

    found = find_external_assets(args.html_dir)
    pages = len(book_pages(args.html_dir))
    if found:
        print(f"{len(found)} file(s) of {args.html_dir} fetch from other hosts (the book must work offline):",
              file=sys.stderr)
        for name, urls in found.items():
            for url in urls:
                print(f"  {name}: {url}", file=sys.stderr)
        return 1
    print(f"offline check: {pages} pages, no external script, style sheet, font or image")
    return 0


if __name__ == "__main__":
    sys.exit(main())
