#!/usr/bin/env python3
"""mdBook preprocessor: links that leave the book become text in the built book.

A page may link to any file of the repository ([chaos/HISTORY.md](../../../chaos/HISTORY.md)):
on GitHub, where the pages are read as they are, the link works. The built book holds
only docs/src/, so there such a link would point nowhere; this turns it into its text,
followed by the file's path in the repository when the text does not already show it.
Code blocks and code spans are left alone. scripts/linkcheck checks both forms: the
links of the Markdown against the repository, and those of the built book against it.

mdBook runs it as `python3 repo-links.py supports <renderer>` (every renderer is
supported), then with `[context, book]` as JSON on stdin, and reads the book back.
"""

import json
import os
import posixpath
import re
import sys

LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def outside(target, page):
    """The repository path `target` names from `page` (both relative to the book's
    src/), or None when it stays inside the book or is not a relative link."""
    if SCHEME.match(target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
    if resolved == ".." or resolved.startswith("../"):
        # src/ is docs/src/ in the repository.
        repo = posixpath.normpath(posixpath.join("docs/src", resolved))
        return repo if not repo.startswith("..") else None
    return None


def rewrite_text(text, page):
    def repl(m):
        bang, label, target = m.groups()
        repo = outside(target, page)
        if repo is None:
            return m.group(0)
        shown = label.strip("`").rstrip("/")
        if bang or shown in (repo, repo.rstrip("/"), posixpath.basename(repo)):
            return label
        return f"{label} (`{repo}`)"

    # Links may span lines; code blocks and code spans are masked (same length) so that
    # nothing in them counts as a link, and the rewrite is applied to the original text.
    masked = []
    fence = None
    for line in text.split("\n"):
        stripped = line.lstrip()
        marker = stripped[:3]
        if fence is None and marker in ("```", "~~~"):
            fence = marker
            masked.append(" " * len(line))
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            masked.append(" " * len(line))
        else:
            masked.append(re.sub(r"(`+)(.*?)\1", lambda m: "`" * len(m.group(0)), line))
    masked = "\n".join(masked)
    out = []
    last = 0
    for m in LINK.finditer(masked):
        original = LINK.match(text, m.start(), m.end())
        if original is None:
            continue
        out.append(text[last : m.start()])
        out.append(repl(original))
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def walk(item):
    if isinstance(item, dict):
        if "content" in item and ("source_path" in item or "path" in item):
            page = item.get("source_path") or item.get("path")
            if page:
                item["content"] = rewrite_text(item["content"], page.replace(os.sep, "/"))
        for value in item.values():
            walk(value)
    elif isinstance(item, list):
        for value in item:
            walk(value)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "supports":
        return 0
    _context, book = json.load(sys.stdin)
    walk(book)
    json.dump(book, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
