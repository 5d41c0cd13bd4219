#!/usr/bin/python3
"""Builds the English training corpus for the bundled models from Debian packages.

Stdlib only (runs under Debian's /usr/bin/python3). Usage:

  tools/train/fetch_corpus.sh WORKDIR        # apt-get download + dpkg -x into WORKDIR/x
  /usr/bin/python3 tools/train/make_corpus.py WORKDIR/x OUT.jsonl.xz

Each source file becomes one document of prose paragraphs: markup is stripped, code blocks are
dropped, and a paragraph is kept only if it looks like prose (mostly letters and spaces, several
words). Paragraphs are deduplicated across the whole corpus. Output is xz-compressed JSON lines,
{"src": ..., "split": "train"|"val", "text": ...}; a document goes to "val" when the hash of its
path falls in the lowest 2%, so the split is deterministic.
"""

import hashlib
import html
import html.parser
import json
import lzma
import os
import re
import subprocess
import sys
import zlib

ASCII_MAP = {
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": " - ",
    "\u2026": "...", "\u00a0": " ", "\u2022": "*", "\u00b6": "", "\u2192": "->", "\u200b": "",
}
ASCII_RE = re.compile("|".join(re.escape(k) for k in ASCII_MAP))


def normalize(text):
    text = ASCII_RE.sub(lambda m: ASCII_MAP[m.group(0)], text)
    return re.sub(r"\s+", " ", text).strip()


def is_prose(par):
    if len(par) < 40:
        return False
    words = par.split()
    if len(words) < 7:
        return False
    letters = sum(c.isalpha() or c == " " for c in par)
    if letters / len(par) < 0.82:
        return False
    # Identifier-heavy text (snake_case, dotted names, calls) is code, not prose.
    codeish = sum(1 for w in words if "_" in w or "()" in w or "::" in w or "=" in w)
    return codeish / len(words) < 0.08


# ---------------------------------------------------------------- reStructuredText (Python docs)
RST_ROLE = re.compile(r":[a-zA-Z:]+:`~?!?([^`<]*?)(?:\s*<[^>]*>)?`")
RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
RST_REF = re.compile(r"`([^`]+)`_+")
RST_LIT = re.compile(r"``([^`]+)``")
RST_EMPH = re.compile(r"\*\*?([^*]+)\*\*?")
RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:.])\1{3,}\s*$")


def rst_paragraphs(text):
    pars, cur = [], []
    in_block = False  # inside an indented literal block or directive body
    block_indent = 0
    prev_literal = False
    for raw in text.split("\n"):
        line = raw.rstrip()
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        if in_block:
            if not stripped or indent > block_indent:
                continue
            in_block = False
        if not stripped:
            if cur:
                pars.append(" ".join(cur))
                prev_literal = cur[-1].endswith("::")
                cur = []
            continue
        if prev_literal and indent > 0:
            in_block, block_indent = True, indent - 1
            prev_literal = False
            continue
        prev_literal = False
        if stripped.startswith(".. ") or stripped.startswith(">>>") or stripped.startswith("|"):
            if cur:
                pars.append(" ".join(cur))
                cur = []
            in_block, block_indent = True, indent
            continue
        if RST_UNDERLINE.match(stripped):
            cur = []  # the previous line was a heading
            continue
        if indent >= 4 and not cur:
            continue  # indented block not introduced by '::' (definition bodies etc. kept below)
        cur.append(stripped)
    if cur:
        pars.append(" ".join(cur))
    out = []
    for p in pars:
        if p.endswith("::"):
            p = p[:-1]
        p = RST_ROLE.sub(r"\1", p)
        p = RST_LINK.sub(r"\1", p)
        p = RST_REF.sub(r"\1", p)
        p = RST_LIT.sub(r"\1", p)
        p = RST_EMPH.sub(r"\1", p)
        p = re.sub(r"^[*\-+] |^\d+\. |^#\. ", "", p)
        out.append(p)
    return out


# ---------------------------------------------------------------- HTML (PostgreSQL, SQLite, Rust)
class ProseHTML(html.parser.HTMLParser):
    SKIP = {"pre", "script", "style", "nav", "head", "table", "code-block", "svg", "button",
            "select", "noscript"}
    BLOCK = {"p", "div", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "br", "tr",
             "blockquote", "section", "article", "td", "th", "ul", "ol", "dl", "body", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.skip = 0
        self.pars = []
        self.cur = []

    def flush(self):
        if self.cur:
            self.pars.append("".join(self.cur))
            self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.flush()

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.flush()

    def handle_data(self, data):
        if not self.skip:
            self.cur.append(data)


def html_paragraphs(text):
    parser = ProseHTML()
    try:
        parser.feed(text)
        parser.close()
    except Exception:  # malformed markup: keep what was parsed
        pass
    parser.flush()
    return [html.unescape(p) for p in parser.pars]


# ---------------------------------------------------------------- dictd databases (public domain)
def dict_paragraphs(path):
    with open(path, "rb") as f:
        data = zlib.decompress(f.read(), 16 + zlib.MAX_WBITS).decode("utf-8", "replace")
    pars, cur = [], []
    for line in data.split("\n"):
        if not line.strip():
            if cur:
                pars.append(" ".join(cur))
                cur = []
        else:
            cur.append(line.strip())
    if cur:
        pars.append(" ".join(cur))
    return [re.sub(r"[{}]", "", p) for p in pars if not p.startswith("00-database")]


# ---------------------------------------------------------------- King James Bible
def kjv_documents(root):
    exe = os.path.join(root, "bible-kjv/usr/bin/bible")
    data = os.path.join(root, "bible-kjv-text/usr/lib")
    books = ("gen ex lev num deut josh judg ruth 1sam 2sam 1kings 2kings 1chron 2chron ezra neh "
             "esther job ps prov eccl song isa jer lam ezek dan hos joel amos obad jonah micah "
             "nahum hab zeph hag zech mal matt mark luke john acts rom 1cor 2cor gal eph phil col "
             "1thess 2thess 1tim 2tim titus philem heb jas 1pet 2pet 1john 2john 3john jude rev")
    docs = []
    for book in books.split():
        out = subprocess.run([exe, "-p", data, "-f", "-m", "8000000", f"{book}1:1-{book}150:176"],
                             capture_output=True, text=True, check=False).stdout
        chapters = {}
        for line in out.split("\n"):
            m = re.match(r"^\s*(\d?[A-Za-z]+)(\d+):(\d+)\s+(.*)$", line)
            if m:
                chapters.setdefault(m.group(2), []).append(m.group(4).strip())
        for ch, verses in chapters.items():
            docs.append((f"bible-kjv-text:{book}{ch}", [" ".join(verses)]))
    return docs


def collect(root):
    """Yields (source id, list of raw paragraphs) per document."""
    rst_roots = [
        ("python3.11-doc", "python3.11-doc/usr/share/doc/python3.11/html/_sources"),
        ("sphinx-doc", "sphinx-doc/usr/share/doc/sphinx-doc/html/_sources"),
    ]
    for pkg, sub in rst_roots:
        base = os.path.join(root, sub)
        for dirpath, _, files in sorted(os.walk(base)):
            for name in sorted(files):
                p = os.path.join(dirpath, name)
                if name.endswith(".rst.txt") and "changelog" not in p:
                    with open(p, encoding="utf-8", errors="replace") as f:
                        yield f"{pkg}:" + os.path.relpath(p, base), rst_paragraphs(f.read())
    html_roots = [
        ("postgresql-doc-15", "postgresql-doc-15/usr/share/doc/postgresql-doc-15/html"),
        ("sqlite3-doc", "sqlite3-doc/usr/share/doc/sqlite3"),
        ("rust-doc", "rust-doc/usr/share/doc/rust-doc/html/book"),
        ("rust-doc", "rust-doc/usr/share/doc/rust-doc/html/rust-by-example"),
        ("rust-doc", "rust-doc/usr/share/doc/rust-doc/html/reference"),
        ("rust-doc", "rust-doc/usr/share/doc/rust-doc/html/rustc"),
        ("rust-doc", "rust-doc/usr/share/doc/rust-doc/html/std"),
        ("python-django-doc", "python-django-doc/usr/share/doc/python-django-doc/html"),
    ]
    for pkg, sub in html_roots:
        base = os.path.join(root, sub)
        for dirpath, _, files in sorted(os.walk(base)):
            for name in sorted(files):
                if not name.endswith(".html") or name == "print.html":
                    continue
                p = os.path.join(dirpath, name)
                with open(p, encoding="utf-8", errors="replace") as f:
                    yield f"{pkg}:" + os.path.relpath(p, base), html_paragraphs(f.read())
    for pkg, db in (("dict-devil", "dict-devil/usr/share/dictd/devil.dict.dz"),
                    ("dict-jargon", "dict-jargon/usr/share/dictd/jargon.dict.dz")):
        pars = dict_paragraphs(os.path.join(root, db))
        for i in range(0, len(pars), 200):
            yield f"{pkg}:{i // 200}", pars[i:i + 200]
    yield from kjv_documents(root)


def main():
    root, out_path = sys.argv[1], sys.argv[2]
    seen = set()
    stats = {}
    n_docs = 0
    with lzma.open(out_path, "wt", encoding="utf-8", preset=9) as out:
        for src, raw in collect(root):
            kept = []
            for p in raw:
                p = normalize(p)
                if not is_prose(p):
                    continue
                h = hashlib.sha1(p.encode()).digest()
                if h in seen:
                    continue
                seen.add(h)
                kept.append(p)
            if not kept:
                continue
            text = "\n".join(kept)
            bucket = int.from_bytes(hashlib.sha1(src.encode()).digest()[:4], "big") % 100
            split = "val" if bucket < 2 else "train"
            out.write(json.dumps({"src": src, "split": split, "text": text}) + "\n")
            pkg = src.split(":")[0]
            s = stats.setdefault(pkg, {"docs": 0, "bytes": 0})
            s["docs"] += 1
            s["bytes"] += len(text.encode())
            n_docs += 1
    total = sum(s["bytes"] for s in stats.values())
    print(json.dumps({"documents": n_docs, "bytes": total, "by_package": stats}, indent=1))


if __name__ == "__main__":
    main()
