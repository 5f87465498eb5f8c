"""`make docs-check`: the built docs site checked as a reader meets it.

Two checks. ``broken_links`` reads every page of the built site and follows every link and asset inside it: the
target file must exist and an anchor must name an element of that page; a page that loads anything from outside the
site (a font, a script) is an error too, since the site must work offline (also run by tests/test_docs.py). Then the
site is served on 127.0.0.1 and pages are opened in headless Chromium (``ui_check.browse``): each page's rendered DOM
must hold what a reader came for, and a screenshot of each lands in site-check/.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
# page, then what its rendered DOM must contain: the config reference and two how-to pages
PAGES = {
    "reference/config.html": ["Config reference", "model.lora.rank", "algo.offpolicy", "Algorithm presets"],
    "guides/placement.html": ["Placement and scale-out", "cluster.placement", "weights.transport"],
    "guides/resume.html": ["Resume after failure", "latest.json", "bit-identical"],
    "index.html": ["grpo-flow", "Getting started", "Reference"],
}
_LINK_ATTRS = {"a": "href", "link": "href", "script": "src", "img": "src", "source": "src", "iframe": "src"}


class _Page(HTMLParser):
    """The ids a page defines and the links it holds (tag, url)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(values[key])
        attr = _LINK_ATTRS.get(tag)
        if attr and values.get(attr):
            self.links.append((tag, values[attr]))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def broken_links(site: Path) -> list[str]:
    """Every link of every page of ``site`` that leads nowhere, as 'page: link (why)'."""
    site = site.resolve()
    _parse.cache_clear()
    problems = []
    for page_path in sorted(site.rglob("*.html")):
        page = page_path.relative_to(site)
        for tag, url in _parse(page_path).links:
            parts = urlsplit(url)
            if parts.scheme in ("mailto", "data", "javascript"):
                continue
            if parts.scheme or parts.netloc:
                if tag != "a":  # an asset from outside: the page would not work offline
                    problems.append(f"{page}: {url} (loads from outside the site)")
                continue
            base = site if parts.path.startswith("/") else page_path.parent  # 404.html links from the site root
            target = page_path if not parts.path else (base / unquote(parts.path).lstrip("/")).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_relative_to(site) or not target.is_file():
                problems.append(f"{page}: {url} (no such file)")
                continue
            anchor = unquote(parts.fragment)
            if anchor and target.suffix == ".html" and anchor not in _parse(target).ids:
                problems.append(f"{page}: {url} (no element with id {anchor!r} in {target.relative_to(site)})")
    return problems


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from ui_check import CheckFailed, browse, check

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, nargs="?", default=ROOT / "site", help="the built site (make docs)")
    parser.add_argument("--out", type=Path, default=ROOT / "site-check", help="where the screenshots go")
    args = parser.parse_args(argv)
    try:
        check((args.site / "index.html").is_file(), f"{args.site}/index.html exists (make docs builds it)")
        pages = len(list(args.site.rglob("*.html")))
        broken = broken_links(args.site)
        for problem in broken:
            print(f"  broken: {problem}")
        check(not broken, f"every link and asset of the {pages} pages resolves inside the site")
        args.out.mkdir(parents=True, exist_ok=True)
        server, url = _serve(args.site)
        try:
            for page, expected in PAGES.items():
                png = args.out / (page.replace("/", "_").removesuffix(".html") + ".png")
                dom = browse(f"{url}/{page}", png)
                missing = [text for text in expected if text not in dom]
                check(not missing, f"{page} renders with {expected}" + (f"; missing {missing}" if missing else ""))
        finally:
            server.shutdown()
    except CheckFailed as err:
        print(f"FAILED: {err}")
        return 1
    print(f"docs-check passed: screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
