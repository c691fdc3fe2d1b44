"""MkDocs hook: links from the manual to files of the repository outside docs/ (benchmarks/RESULTS.md,
tui/README.md, a test module) and the pictures in screenshots/. Written as relative links (`../benchmarks/RESULTS.md`), they work on
GitHub and in an editor. In the site they point to a copy of the file under repo/: the hook checks that
each one exists (a missing one is a warning, so `mkdocs build --strict` fails) and copies it."""

from __future__ import annotations

import logging
import posixpath
import re
import shutil
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repo_links")
LINK = re.compile(r"(!?)\[([^\]]*)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")
_copies: set[str] = set()


def _repo(config) -> Path:
    return Path(config["docs_dir"]).resolve().parent


def on_page_markdown(markdown, page, config, files):
    root, docs = _repo(config), Path(config["docs_dir"]).resolve()
    here = (docs / page.file.src_path).parent

    def rewrite(match: re.Match) -> str:
        image, text, target, anchor = match.group(1), match.group(2), match.group(3), match.group(4) or ""
        path = (here / target).resolve()
        if docs in path.parents or path == docs:
            return match.group(0)                     # a page of the manual: MkDocs checks it
        if root not in path.parents or not path.exists():
            log.warning("%s links to %s, which is not a file of the repository", page.file.src_path, target)
            return match.group(0)
        rel = path.relative_to(root).as_posix()
        _copies.add(rel)
        depth = page.url.count("/")
        href = posixpath.join(*([".."] * depth), "repo", rel) if depth else posixpath.join("repo", rel)
        if image:
            return f'<img src="{href}" alt="{text}">'
        html_text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
        return f'<a href="{href}{anchor}">{html_text}</a>'

    return LINK.sub(rewrite, markdown)


def on_post_build(config):
    root, site = _repo(config), Path(config["site_dir"])
    for rel in sorted(_copies):
        source, target = root / rel, site / "repo" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(source, target)
