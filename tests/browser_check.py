"""Open every page of the built book in headless Chromium and check that it works offline.

Serves the built HTML (default _build/html) on 127.0.0.1 with Python's http.server, then drives
a headless Chromium (found by tests/find_browser.py: Debian's, or Playwright's) with Playwright.  Every request that would leave the
loopback address is blocked and counted as a failure.  For every page it checks:

- no failed request (blocked, network error, or HTTP status >= 400);
- no console error and no uncaught exception;
- every formula typeset: each Sphinx `.math` element holds a MathJax `mjx-container`, and no
  MathJax error (`mjx-merror`) appears;
- no display equation wider than its text column at 1280 px (a long one is broken over lines
  in its source: MathJax 3 does not break lines itself);
- every image loaded (`naturalWidth > 0`), and every figure (a notebook output image) has alt text;
- every internal link resolves to an existing file, and its `#anchor`, if any, to an element
  with that id (or name) on the target page;
- every folded cell (a solution, an instructor box) is closed when the page loads, and the chapters
  with instructor boxes (INSTRUCTOR_BOXES) show at least one.

It saves full-page screenshots of the landing page, of the exact-KL chapter and of the glossary
(formulas) into --screenshots, then prints a summary (pages, requests, failures, formulas typeset) and exits 1
if anything failed.

Usage: python tests/browser_check.py [_build/html] [--screenshots _build/screenshots]
(`make browser-check`; not collected by pytest: it needs the built book and a browser.)
"""

from __future__ import annotations

import argparse
import functools
import http.server
import posixpath
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# No GPU, no sandbox (root in a container), and nothing that phones home; the host resolver
# rule makes any name other than the loopback address fail to resolve, as a second fence
# behind the request blocking below.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
LANDING_PAGE = "book/intro.html"
KL_CHAPTER = "notebooks/05_exact_kl.html"
FORMULA_PAGE = "book/glossary.html"  # formulas in every build, even before the KL chapter lands
# The chapters whose verification cells (digests, rounding tolerances, replays) are folded into
# instructor boxes: each page must show at least one, closed (tests/test_notebook_tags.py: the tags).
INSTRUCTOR_BOXES = ("notebooks/02_one_group.html", "notebooks/05_exact_kl.html", "notebooks/06_grpo_run.html")
INSTRUCTOR_PROMPT = "For instructors: how this is verified"
NAVIGATION_TIMEOUT_MS = 30_000
MATHJAX_TIMEOUT_MS = 20_000
# How long a checked page's late requests (MathJax's fonts) may take to finish.  Playwright's
# "networkidle" (no request for 500 ms, within 10 s) failed on a loaded CI machine with no request
# named; the check counts its own in-flight requests instead and names any still open.
LATE_REQUESTS_TIMEOUT_S = 60.0
# ... and how long the page must then stay quiet (no request open, none started or ended): a font that
# MathJax asks for as the page lays out can start just after the last one ended (a loaded machine
# showed one aborted by the next navigation).
QUIET_S = 1.0

# Run in the page after it has loaded: wait for MathJax and the images, then report what the
# checks need.  MathJax is loaded with `defer`, so `MathJax.startup` exists by the load event
# when the script arrived; if it did not, the formulas are reported untypeset.
PAGE_REPORT_JS = """
async (mathjaxTimeoutMs) => {
  const timeout = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  let mathjax = "absent";
  if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
    const done = await Promise.race([
      window.MathJax.startup.promise.then(() => "ready", (e) => "error: " + e),
      timeout(mathjaxTimeoutMs).then(() => "timeout"),
    ]);
    mathjax = done;
  }
  const images = Array.from(document.images);
  for (const img of images) { img.loading = "eager"; }
  await Promise.race([
    Promise.all(images.map((img) => img.complete ? null
      : new Promise((resolve) => { img.addEventListener("load", resolve); img.addEventListener("error", resolve); }))),
    timeout(10000),
  ]);
  const mathElements = Array.from(document.querySelectorAll(".math"));
  // A display equation overflows when its typeset width exceeds the width of its own box
  // (the box is as wide as the text column; the theme lets it scroll, which hides the rest).
  const overflowing = Array.from(document.querySelectorAll("div.math")).map((el) => {
    const inner = el.querySelector("mjx-container mjx-math");
    if (!inner) { return null; }
    const width = inner.getBoundingClientRect().width;
    return width > el.clientWidth + 1
      ? {width: Math.round(width), column: el.clientWidth, tex: el.textContent.slice(0, 60)} : null;
  }).filter((x) => x);
  return {
    overflowing: overflowing,
    mathjax: mathjax,
    math: mathElements.length,
    typeset: mathElements.filter((el) => el.querySelector("mjx-container")).length,
    untypeset: mathElements.filter((el) => !el.querySelector("mjx-container"))
                           .slice(0, 3).map((el) => el.textContent.slice(0, 60)),
    mathErrors: Array.from(document.querySelectorAll("mjx-merror")).map((el) => el.textContent.slice(0, 60)),
    images: images.map((img) => ({src: img.currentSrc || img.src, ok: img.complete && img.naturalWidth > 0,
                                  figure: !!img.closest(".cell_output, figure"),
                                  alt: (img.getAttribute("alt") || "").trim()})),
    links: Array.from(document.querySelectorAll("a[href]")).map((a) => a.href),
    anchors: Array.from(document.querySelectorAll("[id], a[name]")).map((el) => el.id || el.getAttribute("name")),
    // folded cells (solutions, instructor boxes): their toggle text, and whether their content shows at load
    folds: Array.from(document.querySelectorAll("details.hide")).map((el) => ({
      summary: (el.querySelector("summary") || el).textContent.trim().split(/\\s*\\n/)[0].trim(),
      open: el.open,
      // a closed <details> keeps its content's layout boxes (content-visibility), so ask the browser
      shown: Array.from(el.children).filter((c) => c.tagName !== "SUMMARY")
                                   .some((c) => c.checkVisibility ? c.checkVisibility()
                                                : c.getBoundingClientRect().height > 0),
    })),
  };
}
"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # the summary reports what matters
        pass


def serve(html_dir: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve html_dir on 127.0.0.1 at a free port, in a daemon thread; returns (server, base URL)."""
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _AnchorCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and (name == "id" or (tag == "a" and name == "name")):
                self.anchors.add(value)


def static_anchors(path: Path) -> set[str]:
    """Ids and named anchors of an HTML file that the browser did not visit."""
    collector = _AnchorCollector()
    collector.feed(path.read_text(encoding="utf-8", errors="replace"))
    return collector.anchors


def is_redirect(path: Path) -> bool:
    """True for a page that only forwards the reader elsewhere with a meta refresh."""
    head = path.read_text(encoding="utf-8", errors="replace")[:2000].lower()
    return 'http-equiv="refresh"' in head


def local_file(html_dir: Path, url_path: str) -> Path:
    """The file a server path maps to (directories to their index.html)."""
    rel = posixpath.normpath(unquote(url_path)).lstrip("/")
    target = html_dir / rel if rel not in ("", ".") else html_dir
    return target / "index.html" if target.is_dir() else target


def broken_links(html_dir: Path, base_url: str, links: dict[str, list[str]],
                 anchors: dict[str, set[str]]) -> list[str]:
    """'page -> link (why)' for every internal link that does not resolve.

    links: {page: [absolute hrefs]}; anchors: {page: ids} for the visited pages (others are
    parsed from disk).  Links to other hosts and non-http schemes are not followed.
    """
    base = urlsplit(base_url)
    problems = []
    for page, hrefs in links.items():
        for href in sorted(set(hrefs)):
            parts = urlsplit(href)
            if parts.scheme not in ("http", "https") or parts.netloc != base.netloc:
                continue
            target = local_file(html_dir, parts.path)
            if not target.is_file():
                problems.append(f"{page} -> {href} (no file {target.relative_to(html_dir)})")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                rel = target.relative_to(html_dir).as_posix()
                if rel not in anchors:
                    anchors[rel] = static_anchors(target)
                if fragment not in anchors[rel]:
                    problems.append(f"{page} -> {href} (no id {fragment!r} in {rel})")
    return problems


def check_book(html_dir: Path, screenshots: Path) -> int:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from labkit.book.build import book_pages

    if not (html_dir / "index.html").is_file():
        print(f"{html_dir} has no index.html: build the book first (make book)", file=sys.stderr)
        return 1
    from find_browser import HOW_TO_GET_ONE, find_chromium

    chromium = find_chromium()
    if chromium is None:
        print(HOW_TO_GET_ONE, file=sys.stderr)
        return 1
    pages = book_pages(html_dir)
    screenshots.mkdir(parents=True, exist_ok=True)
    wanted_shots = {LANDING_PAGE: screenshots / "landing.png", KL_CHAPTER: screenshots / "kl_chapter.png",
                    FORMULA_PAGE: screenshots / "glossary.png"}
    for shot in wanted_shots.values():  # a screenshot left from an earlier build would mislead
        shot.unlink(missing_ok=True)

    server, base_url = serve(html_dir)
    started = time.monotonic()
    failures: list[str] = []
    requests = 0
    external_links = set()
    formulas = typeset = 0
    links: dict[str, list[str]] = {}
    anchors: dict[str, set[str]] = {}
    try:
        with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="browser-check-") as profile:
            context = pw.chromium.launch_persistent_context(
                profile, executable_path=chromium, headless=True, args=CHROMIUM_FLAGS,
                viewport={"width": 1280, "height": 900}, service_workers="block",
            )
            current = {"page": ""}
            blocked: set[str] = set()

            def route(route):
                url = route.request.url
                if url.startswith(base_url) or url.startswith(("data:", "blob:")):
                    route.continue_()
                else:
                    blocked.add(url)
                    failures.append(f"{current['page']}: request to another host blocked: {url}")
                    route.abort("blockedbyclient")

            in_flight: dict[object, str] = {}  # request -> URL, from sent until finished or failed
            sent_by: dict[object, str] = {}  # request -> the page being checked when it was sent
            last_activity = [time.monotonic()]  # when a request last started, finished or failed
            left_behind: list[str] = []  # a page's requests that the check's next navigation aborted

            def on_request(request):
                nonlocal requests
                requests += 1
                in_flight[request] = request.url
                sent_by[request] = current["page"]
                last_activity[0] = time.monotonic()

            def on_finished(request):
                in_flight.pop(request, None)
                last_activity[0] = time.monotonic()

            def on_failed(request):
                in_flight.pop(request, None)
                last_activity[0] = time.monotonic()
                page_of = sent_by.get(request, current["page"])
                if request.url in blocked:
                    return
                if "ERR_ABORTED" in str(request.failure) and page_of != current["page"]:
                    # a request of the page just left, aborted by the check's own navigation (a reader
                    # clicking on does the same): said, not failed; it must not be one that never ends
                    left_behind.append(f"{page_of}: {request.url}")
                    return
                failures.append(f"{page_of}: request failed ({request.failure}): {request.url}")

            def on_response(response):
                if response.status >= 400:
                    failures.append(f"{current['page']}: HTTP {response.status}: {response.url}")

            def on_console(message):
                if message.type == "error":
                    failures.append(f"{current['page']}: console error: {message.text}")

            context.route("**/*", route)
            context.on("request", on_request)
            context.on("requestfinished", on_finished)
            context.on("requestfailed", on_failed)
            context.on("response", on_response)
            context.on("console", on_console)
            page = context.pages[0] if context.pages else context.new_page()
            page.on("pageerror", lambda error: failures.append(f"{current['page']}: uncaught exception: {error}"))
            page.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)

            for name in pages:
                current["page"] = name
                page.goto(base_url + name, wait_until="load")
                if is_redirect(html_dir / name):  # index.html: a meta refresh to the landing page
                    page.wait_for_url(lambda url: url != base_url + name, wait_until="load")
                report = page.evaluate(PAGE_REPORT_JS, MATHJAX_TIMEOUT_MS)
                # Let the page's late requests (MathJax fonts fetched as it typesets) finish before the
                # next navigation aborts them: an aborted font is the check's doing, not the book's.
                waited_until = time.monotonic() + LATE_REQUESTS_TIMEOUT_S
                while (in_flight or time.monotonic() - last_activity[0] < QUIET_S) \
                        and time.monotonic() < waited_until:
                    page.wait_for_timeout(100)  # lets Playwright deliver the requests' events
                if in_flight:
                    failures.append(f"{name}: {len(in_flight)} requests still pending "
                                    f"{LATE_REQUESTS_TIMEOUT_S:.0f} s after the page was checked: "
                                    f"{sorted(set(in_flight.values()))[:3]}")
                    in_flight.clear()
                if report["math"] and report["mathjax"] != "ready":
                    failures.append(f"{name}: {report['math']} formulas but MathJax is {report['mathjax']}")
                formulas += report["math"]
                typeset += report["typeset"]
                if report["typeset"] != report["math"]:
                    failures.append(f"{name}: {report['math'] - report['typeset']} of {report['math']} formulas "
                                    f"not typeset, e.g. {report['untypeset']}")
                for wide in report["overflowing"]:
                    failures.append(f"{name}: display equation {wide['width']} px wide in a {wide['column']} px "
                                    f"column (break it over lines): {wide['tex']!r}")
                for text in report["mathErrors"]:
                    failures.append(f"{name}: MathJax error in formula: {text}")
                for image in report["images"]:
                    if not image["ok"]:
                        failures.append(f"{name}: image not loaded: {image['src']}")
                    if image["figure"] and not image["alt"]:
                        failures.append(f"{name}: figure without alt text: {image['src']} (set the cell's "
                                        "metadata mystnb.image.alt)")
                for fold in report["folds"]:
                    if fold["open"] or fold["shown"]:
                        failures.append(f"{name}: the fold {fold['summary']!r} is open when the page loads")
                folds = {f["summary"] for f in report["folds"]}
                if name in INSTRUCTOR_BOXES and INSTRUCTOR_PROMPT not in folds:
                    failures.append(f"{name}: no folded box {INSTRUCTOR_PROMPT!r} (its folds: {sorted(folds)})")
                links[name] = report["links"]
                anchors[name] = set(report["anchors"])
                for href in report["links"]:  # a link to a placeholder host is a dead end for a reader
                    host = urlsplit(href).hostname or ""
                    if host.split(".")[-2:-1] == ["example"] or "github.com/example/" in href:
                        failures.append(f"{name}: link to a placeholder: {href}")
                external_links.update(h for h in report["links"]
                                      if h.startswith(("http:", "https:")) and not h.startswith(base_url))
                if name in wanted_shots:
                    page.screenshot(path=str(wanted_shots[name]), full_page=True)
            context.close()
    finally:
        server.shutdown()
        server.server_close()

    failures += broken_links(html_dir, base_url, links, anchors)
    elapsed = time.monotonic() - started
    for failure in failures:
        print("FAIL", failure)
    for aborted in left_behind:
        print("aborted by the next navigation (not a failure):", aborted)
    for name, shot in wanted_shots.items():
        if shot.is_file() and name in pages:
            print(f"screenshot: {shot}")
        else:
            print(f"screenshot skipped: {name} is not in the book yet")
    internal = sum(1 for hrefs in links.values() for h in hrefs if h.startswith(base_url))
    print(f"browser check of {html_dir}: {len(pages)} pages, {requests} requests, {len(failures)} failures, "
          f"{typeset}/{formulas} formulas typeset, {internal} internal links checked "
          f"({len(external_links)} distinct external links not followed), {elapsed:.1f} s")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", nargs="?", default="_build/html", type=Path)
    parser.add_argument("--screenshots", default=Path("_build/screenshots"), type=Path)
    args = parser.parse_args(argv)
    return check_book(args.html_dir.resolve(), args.screenshots)


if __name__ == "__main__":
    sys.exit(main())
