"""Find the headless Chromium that the browser check drives, or install one; print its path.

In order:
1. `$LABKIT_CHROMIUM`, if set (it must be an executable file);
2. Debian's (or Ubuntu's) packaged Chromium: /usr/bin/chromium, /usr/bin/chromium-browser;
3. the Chromium that Playwright manages (`python -m playwright install chromium` puts it
   under ~/.cache/ms-playwright on Linux, ~/Library/Caches/ms-playwright on macOS).

With --install, when none is found: as root on a machine with apt-get, Debian's `chromium`
package is installed (the CI machines); otherwise `python -m playwright install chromium`.
When nothing can be had, it says what is missing and how to get it, and exits 1: the browser
check is never skipped (in CI, with CI=true, a check that cannot run is a failure like any other).

Usage: python tests/find_browser.py [--install]   (`make browser`)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

SYSTEM_CHROMIUMS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
HOW_TO_GET_ONE = (
    "no headless Chromium for the browser check: install Debian's package (sudo apt-get install -y chromium), "
    "or let Playwright fetch its own (.venv/bin/python -m playwright install chromium), "
    "or point LABKIT_CHROMIUM at a Chromium executable"
)


def _executable(path: str | Path) -> bool:
    return Path(path).is_file() and os.access(path, os.X_OK)


def playwright_chromium() -> str | None:
    """The Chromium that Playwright manages, if it has been installed."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    with sync_playwright() as pw:
        path = pw.chromium.executable_path
    return path if path and _executable(path) else None


def find_chromium() -> str | None:
    """The path of the Chromium to use (see the module docstring), or None."""
    chosen = os.environ.get("LABKIT_CHROMIUM")
    if chosen:
        if not _executable(chosen):
            raise SystemExit(f"LABKIT_CHROMIUM={chosen!r} is not an executable file")
        return chosen
    for path in SYSTEM_CHROMIUMS:
        if _executable(path):
            return path
    return playwright_chromium()


def install_chromium() -> None:
    """Debian's package as root where apt-get exists, else Playwright's own download."""
    is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if is_root and shutil.which("apt-get"):
        print("installing Debian's chromium package (apt-get)", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=False, env=env, stdout=subprocess.DEVNULL)
        if any(_executable(p) for p in SYSTEM_CHROMIUMS):
            return
    print("installing Playwright's Chromium (python -m playwright install chromium)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="install a Chromium when none is found")
    args = parser.parse_args(argv)
    path = find_chromium()
    if path is None and args.install:
        install_chromium()
        path = find_chromium()
    if path is None:
        print(HOW_TO_GET_ONE, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
