"""The book's tools: the offline check of the built HTML, and the generated results page.

`find_external_assets(html_dir)` lists every script, style sheet, font, image
or frame that a built page or style sheet would fetch from another host (a CDN,
Google Fonts, ...).  Links a reader may click (`<a href="https://...">`, the
Colab and Binder launch buttons) are not assets and are allowed.

Run after `jupyter-book build`:  python -m labkit.book check-offline _build/html

`python -m labkit.book execute` re-runs every chapter and stores its outputs (after
`make cache`); `python -m labkit.book results [--run runs/qwen]` writes `book/results.md` from a
run's files (labkit.results_page); `--check` says whether the page is current.
"""

from __future__ import annotations

import argparse
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

from .runs import REPO_ROOT, atomic_write_text

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


def execute_notebook(path: str | Path, timeout: int = 600) -> float:
    """Run a notebook top to bottom in a fresh kernel (cwd: its folder) and store its outputs; returns seconds.

    Execution timestamps are not stored, so a re-run changes a notebook only where
    its outputs changed.  A cell that raises stops the run and nothing is written.
    """
    import time

    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    text = nbformat.writes(nb)
    atomic_write_text(path, text if text.endswith("\n") else text + "\n")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.book", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check-offline", help="fail if a built page or style sheet fetches from another host")
    p.add_argument("html_dir", nargs="?", default="_build/html")
    p = sub.add_parser("results", help="write book/results.md from a run's results files (default: the tiny cache)")
    p.add_argument("--run", default=None, help="run folder holding evaluation/results.json (default: runs/tiny)")
    p.add_argument("--out", default=None, help="page to write (default: book/results.md)")
    p.add_argument("--check", action="store_true", help="only check that the page is what the run gives now")
    p = sub.add_parser("execute", help="re-execute chapter notebooks in place and store their outputs "
                                       "(after the cache changed)")
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: every notebooks/*.ipynb)")
    args = parser.parse_args(argv)

    if args.command == "execute":
        for path in args.notebooks or sorted((REPO_ROOT / "notebooks").glob("[0-9]*.ipynb")):
            print(f"executed {path} in {execute_notebook(path):.1f} s", flush=True)
        return 0
    if args.command == "results":
        from . import results_page

        run = args.run or results_page.DEFAULT_RUN
        out = args.out or results_page.DEFAULT_OUT
        if args.check:
            if results_page.is_current(run, out):
                print(f"{out} is current with {run}")
                return 0
            print(f"{out} is out of date with {run}: run `python -m labkit.book results`", file=sys.stderr)
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
