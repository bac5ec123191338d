#!/usr/bin/env python3
"""Gather English prose from Debian documentation packages into a training corpus for the tiny OLMoE.

Install the packages first (Debian 12 "bookworm"; all are in main):

    apt-get install --no-install-recommends python3.11-doc manpages manpages-dev postgresql-doc-15 \\
        debian-reference-en debian-handbook git-doc debian-policy python-django-doc linux-doc-6.1 perl-doc \\
        man-db groff-base

then run, from the repository root:

    python3 tools/gather_corpus.py --out .corpus --data-md models/tiny-olmoe/DATA.md

It reads only files that `dpkg -L <package>` lists, turns each HTML page or manual page into one plain-text
document (paragraphs separated by blank lines), and drops what is not prose: code blocks (<pre>, highlighted
listings), navigation bars, tables of contents, tables, script/style, manual-page SYNOPSIS/EXAMPLES/SEE ALSO/
COLOPHON sections, paragraphs that are mostly symbols, and exact repeats of paragraphs of 40 characters or more
(boilerplate). It writes, xz-compressed, one JSON object per line {"id", "src", "text"}:

    OUT/train.jsonl.xz   the training text (and the tokenizer's training text)
    OUT/val.jsonl.xz     held-out documents used to pick the best checkpoint during training
    OUT/test.jsonl.xz    held-out documents for the reported held-out loss, the expert load and prompts.jsonl
    OUT/manifest.json    per-package counts

The held-out slice is HELDOUT_FRAC of each package's bytes, in whole documents chosen by the SHA-1 of the document
id (deterministic), split alternately into val and test. DATA.md records the packages, their versions and licences.
"""

import argparse
import gzip
import hashlib
import html.parser
import json
import lzma
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

HELDOUT_FRAC = 0.025
MIN_DOC_CHARS = 200

# package -> how to read it, and its licence as stated in /usr/share/doc/<package>/copyright (summarised by hand)
SOURCES = {
    "python3.11-doc": dict(
        kind="html", root=("role", "main"),
        keep=r"^/usr/share/doc/python3\.11/html/.*\.html$",
        drop=r"/(_static|_sources|_downloads|_images)/|/(genindex[^/]*|py-modindex|search|contents)\.html$"
             r"|/whatsnew/changelog\.html$",
        what="The Python 3.11 documentation (tutorial, library and language reference, HOWTOs, FAQs), HTML",
        licence="PSF License Agreement for the documentation (Python Software Foundation; \"Copyright (c) 2001-2023 "
                "Python Software Foundation\"); see the package's copyright file and the documentation's own "
                "license.html"),
    "postgresql-doc-15": dict(
        kind="html", root=None, keep=r"^/usr/share/doc/postgresql-doc-15/html/.*\.html$", drop=None,
        what="The PostgreSQL 15 manual, HTML",
        licence="PostgreSQL License (a permissive BSD/MIT-style licence; Portions Copyright (c) 1996-2022 PostgreSQL "
                "Global Development Group, Portions Copyright (c) 1994 The Regents of the University of California)"),
    "manpages": dict(
        kind="man", keep=r"^/usr/share/man/man[0-9]/[^/]+\.gz$", drop=None,
        what="Linux man-pages project: manual pages of sections 1, 4, 5, 7 and 8 (files, devices, overviews)",
        licence="Per page, mostly the \"Linux-man-pages-copyleft\" licence (verbatim copying and modified versions "
                "permitted with notice), some GPL-2+/GPL-1+/BSD/Expat pages; see the package's copyright file"),
    "manpages-dev": dict(
        kind="man", keep=r"^/usr/share/man/man[0-9]/[^/]+\.gz$", drop=None,
        what="Linux man-pages project: manual pages of sections 2 and 3 (system calls, C library)",
        licence="As for manpages (same source package, same copyright file)"),
    "debian-reference-en": dict(
        kind="html", root=None, keep=r"^/usr/share/debian-reference/.*\.en\.html$", drop=None,
        what="Debian Reference (Osamu Aoki), English, HTML",
        licence="GPL-2+ (\"This document may used under the terms the GNU General Public License version 2 or "
                "higher\")"),
    "debian-handbook": dict(
        kind="html", root=None, keep=r"^/usr/share/doc/debian-handbook/html/en-US/[^/]+\.html$", drop=None,
        what="The Debian Administrator's Handbook (Raphael Hertzog, Roland Mas), English, HTML",
        licence="GPL-2.0+ or CC-BY-SA-3.0 (dual-licensed)"),
    "git-doc": dict(
        kind="html", root=("id", "content"), keep=r"^/usr/share/doc/git-doc/[^/]*\.html$", drop=None,
        what="Git documentation: command manual pages, user manual and guides, HTML",
        licence="GPL-2 (the Git project; some files GPL-2+/LGPL-2.1+/Expat per the copyright file)"),
    "debian-policy": dict(
        kind="html", root=None, keep=r"^/usr/share/doc/debian-policy/.*\.html$", drop=r"/_static/|/genindex\.html$"
                                                                                      r"|/search\.html$",
        what="Debian Policy Manual and its companion documents (incl. the Filesystem Hierarchy Standard 3.0), HTML",
        licence="GPL-2+ (Policy), FHS licence (permission to copy and distribute verbatim and modified copies) for "
                "the FHS; see the package's copyright file"),
    "python-django-doc": dict(
        kind="html", root=("id", "yui-main"), keep=r"^/usr/share/doc/python-django-doc/html/.*\.html$",
        drop=r"/(_modules|_static|_sources|_images)/|/(genindex[^/]*|py-modindex|search|contents)\.html$",
        what="Django 3.2 documentation, HTML",
        licence="BSD-3-Clause (Copyright Django Software Foundation and individual contributors)"),
    "linux-doc-6.1": dict(
        kind="html", root=("role", "main"), keep=r"^/usr/share/doc/linux-doc-6\.1/html/.*\.html$",
        drop=r"/(_static|_sources|_downloads|_images|translations)/|/(genindex|search|py-modindex)\.html$",
        what="The Linux kernel 6.1 documentation (admin guide, process, core API, subsystems; no translations), "
             "HTML",
        licence="GPL-2 (\"Copyright: 1991-2012 Linus Torvalds and many others\", Files: * in the copyright file)"),
    "perl-doc": dict(
        kind="pod", keep=r"^/usr/share/perl/[^/]+/pod/[^/]+\.pod$", drop=None,
        what="Perl 5.36 core documentation (perlintro, perlfunc, perlre, perlfaq, release notes, ...), POD",
        licence="GPL-1+ or Artistic (the Perl licence), per the copyright file's Files: * stanza"),
}

# roots given as (attr, value) restrict extraction to that element (Sphinx's role=main body etc.)
SKIP_TAGS = {"script", "style", "head", "pre", "table", "nav", "noscript", "svg", "math", "select", "button",
             "form", "iframe", "object", "title"}
SKIP_CLASS = re.compile(r"^(navheader|navfooter|docnav|related|sphinxsidebar|sphinxsidebarwrapper|footer|header|"
                        r"nav|global-nav|toc|toctree-wrapper|highlight.*|listingblock|literalblock|programlisting|"
                        r"synopsis|refsynopsisdiv|screen|headerlink|sig|sig-object|clearer|footer-text|"
                        r"this-page-menu|navigation|cmdsynopsis|funcsynopsis|indexentries|index|doctest|"
                        r"literal-block|line-block)$")
SKIP_ID = re.compile(r"^(hd|ft|footer|header|global-nav|toc|sidebar|searchbox|banner|breadcrumbs?)$")
BLOCK_TAGS = {"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "br", "section",
              "blockquote", "tr", "article", "aside", "hr", "figure", "figcaption", "caption", "body", "html",
              "main", "header", "footer", "span_block"}
VOID_TAGS = {"br", "img", "hr", "meta", "link", "input", "col", "area", "base", "wbr", "source", "embed", "param",
             "track", "keygen"}


class Extract(html.parser.HTMLParser):
    def __init__(self, root):
        super().__init__(convert_charrefs=True)
        self.root = root
        self.stack = []        # [tag, skip, is_root]
        self.skip = 0
        self.in_root = 0 if root else 1
        self.paras = []
        self.cur = []
        self.found_root = False

    def _flush(self):
        if self.cur:
            s = "".join(self.cur)
            self.cur = []
            s = re.sub(r"\s+", " ", s.replace("\xa0", " ").replace("\u00b6", "")).strip()
            if s:
                self.paras.append(s)

    def handle_starttag(self, tag, attrs):
        if tag in VOID_TAGS:
            if tag in ("br", "hr") and not self.skip and self.in_root:
                self._flush()
            return
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        skip = tag in SKIP_TAGS or any(SKIP_CLASS.match(c) for c in classes) or \
            bool(a.get("id") and SKIP_ID.match(a["id"])) or a.get("role") == "navigation"
        is_root = bool(self.root and a.get(self.root[0]) == self.root[1])
        if tag in BLOCK_TAGS and not self.skip and self.in_root:
            self._flush()
        self.stack.append([tag, skip, is_root])
        if skip:
            self.skip += 1
        if is_root:
            self.in_root += 1
            self.found_root = True

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                while len(self.stack) > i:
                    t, skip, is_root = self.stack.pop()
                    if skip:
                        self.skip -= 1
                    if is_root:
                        self.in_root -= 1
                break
        if tag in BLOCK_TAGS and not self.skip and self.in_root:
            self._flush()

    def handle_data(self, data):
        if not self.skip and self.in_root:
            self.cur.append(data)

    def close(self):
        super().close()
        self._flush()
        return self.paras


def prose_ok(p):
    words = p.split()
    if len(words) < 2:
        return False
    nonspace = sum(1 for c in p if not c.isspace())
    letters = sum(1 for c in p if c.isalpha())
    return nonspace > 0 and letters / nonspace >= 0.6


def html_doc(path, root):
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", errors="replace")
    ex = Extract(root)
    ex.feed(raw)
    paras = ex.close()
    if root and not ex.found_root:      # a page without the usual body element: take all of it
        ex = Extract(None)
        ex.feed(raw)
        paras = ex.close()
    return [p for p in paras if prose_ok(p)]


MAN_DROP = {"SYNOPSIS", "EXAMPLES", "EXAMPLE", "SEE ALSO", "COLOPHON", "LIBRARY", "ATTRIBUTES", "PROGRAM SOURCE",
            "AUTHOR", "AUTHORS", "REPORTING BUGS", "COPYRIGHT"}


def man_doc(path):
    with gzip.open(path, "rb") as f:
        head = f.read(400)
    if head.startswith(b".so ") or head.startswith(b"'\\\" t\n.so "):
        return []       # a link page (".so other.3"): its text belongs to the target page
    env = dict(os.environ, MANWIDTH="4000", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
    r = subprocess.run(["man", "--nh", "--nj", "-E", "UTF-8", "-l", path], env=env, capture_output=True)
    if r.returncode != 0 or not r.stdout:
        return []
    c = subprocess.run(["col", "-bx"], input=r.stdout, capture_output=True, env=env)
    lines = c.stdout.decode("utf-8", errors="replace").split("\n")
    # drop the header and footer lines (first and last non-empty lines)
    ne = [i for i, l in enumerate(lines) if l.strip()]
    if len(ne) < 3:
        return []
    lines = lines[ne[0] + 1:ne[-1]]
    paras = []
    cur = []
    dropping = False

    def flush():
        if cur and not dropping:
            p = "\n".join(re.sub(r"\s+", " ", l).strip() for l in cur)
            if prose_ok(p):
                paras.append(p)
        cur.clear()

    for l in lines:
        if l and not l[0].isspace():      # a section heading at column 0
            flush()
            dropping = l.strip().upper() in MAN_DROP
            continue
        if not l.strip():
            flush()
            continue
        cur.append(l)
    flush()
    return paras


POD_CODE = re.compile(r"([A-Z])<(?:<+\s(.*?)\s>+|([^<>]*))>")


def _pod_inline(t):
    def rep(m):
        code, inner = m.group(1), m.group(2) if m.group(2) is not None else m.group(3)
        if code in "XZ":
            return ""
        if code == "E":
            return {"gt": ">", "lt": "<", "verbar": "|", "sol": "/"}.get(inner, "")
        if code == "L":
            if "|" in inner:
                return inner.split("|", 1)[0]
            inner = inner.replace('"', "")
            return inner.replace("/", " ") if not inner.startswith("http") else inner
        return inner
    for _ in range(6):
        n = POD_CODE.sub(rep, t)
        if n == t:
            break
        t = n
    return t


def pod_doc(path):
    """Ordinary and heading paragraphs of a POD file; verbatim (indented) paragraphs and =begin/=for blocks are
    dropped, as are =over item lists' bullets themselves (the item text is kept)."""
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", errors="replace")
    paras = []
    in_pod = True
    skip_block = False
    for block in re.split(r"\n[ \t]*\n", raw):
        if not block.strip():
            continue
        if block.startswith("="):
            cmd, _, rest = block.partition(" ")
            cmd = cmd.split("\n")[0]
            if cmd == "=cut":
                in_pod = False
                continue
            in_pod = True
            if cmd == "=begin":
                skip_block = True
                continue
            if cmd == "=end":
                skip_block = False
                continue
            if skip_block or cmd in ("=for", "=encoding", "=over", "=back", "=pod"):
                continue
            if cmd.startswith("=head") or cmd == "=item":
                t = _pod_inline(rest.strip())
                if t and t not in ("*",) and not t.isdigit():
                    t = re.sub(r"^\*\s*", "", t)
                    t = re.sub(r"\s+", " ", t).strip()
                    if prose_ok(t):
                        paras.append(t)
            continue
        if not in_pod or skip_block or block[0] in " \t":
            continue
        t = re.sub(r"\s+", " ", _pod_inline(block)).strip()
        if prose_ok(t):
            paras.append(t)
    return paras


def one(job):
    pkg, path, kind, root = job
    try:
        if kind == "pod":
            paras = pod_doc(path)
        else:
            paras = man_doc(path) if kind == "man" else html_doc(path, tuple(root) if root else None)
    except Exception as e:  # noqa
        print(f"  !! {path}: {e!r}", file=sys.stderr, flush=True)
        paras = []
    return pkg, path, paras


def pkg_files(pkg):
    out = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"package {pkg} is not installed (see the docstring for the apt-get command)")
    return [l for l in out.stdout.split("\n") if l]


def pkg_version(pkg):
    return subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".corpus")
    ap.add_argument("--data-md", default="models/tiny-olmoe/DATA.md")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--packages", default=",".join(SOURCES))
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    pkgs = [p for p in a.packages.split(",") if p]
    jobs = []
    for pkg in pkgs:
        s = SOURCES[pkg]
        keep = re.compile(s["keep"])
        drop = re.compile(s["drop"]) if s.get("drop") else None
        files = sorted(f for f in pkg_files(pkg)
                       if keep.search(f) and not (drop and drop.search(f)) and os.path.isfile(f)
                       and not os.path.islink(f))
        print(f"{pkg}: {len(files)} files", flush=True)
        for f in files:
            jobs.append((pkg, f, s["kind"], s.get("root")))
    with ProcessPoolExecutor(a.jobs) as ex:
        results = list(ex.map(one, jobs, chunksize=8))
    print(f"extracted {len(results)} files in {time.time() - t0:.0f} s", flush=True)

    # global de-duplication of long paragraphs (boilerplate), first occurrence kept, in package then path order
    seen = set()
    docs = []
    dup_chars = 0
    for pkg, path, paras in results:
        kept = []
        for p in paras:
            if len(p) >= 40:
                h = hashlib.sha1(p.encode()).digest()
                if h in seen:
                    dup_chars += len(p)
                    continue
                seen.add(h)
            kept.append(p)
        text = "\n\n".join(kept)
        if len(text) < MIN_DOC_CHARS:
            continue
        docs.append(dict(id=f"{pkg}:{path}", src=pkg, text=text))
    print(f"{len(docs)} documents; {dup_chars / 1e6:.2f} MB of repeated paragraphs dropped", flush=True)

    # held-out: per package, whole documents in SHA-1 order until HELDOUT_FRAC of the package's bytes
    split = {}
    stats = {}
    for pkg in pkgs:
        pd = [d for d in docs if d["src"] == pkg]
        tot = sum(len(d["text"].encode()) for d in pd)
        order = sorted(pd, key=lambda d: hashlib.sha1(d["id"].encode()).hexdigest())
        acc = 0
        n = 0
        for d in order:
            if acc >= HELDOUT_FRAC * tot:
                break
            split[d["id"]] = "val" if n % 2 == 0 else "test"
            acc += len(d["text"].encode())
            n += 1
        st = dict(version=pkg_version(pkg), documents=len(pd), bytes=tot)
        for part in ("train", "val", "test"):
            sel = [d for d in pd if split.get(d["id"], "train") == part]
            st[part + "_documents"] = len(sel)
            st[part + "_bytes"] = sum(len(d["text"].encode()) for d in sel)
        stats[pkg] = st
        print(f"  {pkg:22s} {st['version']:24s} {len(pd):5d} docs {tot / 1e6:7.2f} MB; held out "
              f"{st['val_documents']}+{st['test_documents']} docs "
              f"{(st['val_bytes'] + st['test_bytes']) / 1e6:.2f} MB", flush=True)
    sizes = {}
    for part in ("train", "val", "test"):
        fn = os.path.join(a.out, f"{part}.jsonl.xz")
        with lzma.open(fn, "wt", encoding="utf-8", preset=6) as f:
            for d in docs:
                if split.get(d["id"], "train") == part:
                    f.write(json.dumps(d, ensure_ascii=False) + "\n")
        sizes[part] = dict(text_bytes=sum(len(d["text"].encode()) for d in docs
                                          if split.get(d["id"], "train") == part),
                           xz_bytes=os.path.getsize(fn))
        print(f"  {fn}: {sizes[part]['text_bytes'] / 1e6:.2f} MB text, {sizes[part]['xz_bytes'] / 1e6:.2f} MB xz",
              flush=True)
    manifest = dict(packages=stats, parts=sizes, heldout_frac=HELDOUT_FRAC, min_doc_chars=MIN_DOC_CHARS,
                    repeated_paragraph_bytes_dropped=dup_chars, command="python3 tools/gather_corpus.py " +
                    " ".join(sys.argv[1:]))
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    if a.data_md:
        write_data_md(a.data_md, pkgs, stats, sizes, dup_chars)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


def write_data_md(fn, pkgs, stats, sizes, dup_chars):
    os.makedirs(os.path.dirname(fn) or ".", exist_ok=True)
    tot = sum(s["text_bytes"] for s in sizes.values())
    L = []
    L.append("# Training data of the tiny OLMoE\n")
    L.append("English prose from documentation that Debian 12 (bookworm) ships in its main archive, gathered by "
             "`tools/gather_corpus.py` (which lists the `apt-get install` command) from the files that "
             "`dpkg -L <package>` lists. Each HTML page or manual page is one document; code blocks, navigation, "
             "tables, tables of contents and manual-page SYNOPSIS/EXAMPLES/SEE ALSO/COLOPHON sections are dropped, "
             "as are paragraphs that are mostly symbols and exact repeats of paragraphs of 40 characters or more "
             f"({dup_chars / 1e6:.2f} MB of them). The text itself is not in the repository; rerun the script to "
             "make it again.\n")
    L.append(f"In all {tot / 1e6:.1f} MB of UTF-8 text. A held-out slice of {HELDOUT_FRAC:.1%} of each package's "
             "bytes, whole documents chosen by the SHA-1 of the document id, is not trained on: half of it "
             "(`val`) picks the best checkpoint during training, the other half (`test`) gives the held-out loss, "
             "the expert load and the passages of `prompts.jsonl`.\n")
    L.append("| package | version | what | documents | MB of text | held out (val + test documents) |")
    L.append("|---|---|---|---|---|---|")
    for p in pkgs:
        s = stats[p]
        L.append(f"| `{p}` | {s['version']} | {SOURCES[p]['what']} | {s['documents']} | {s['bytes'] / 1e6:.2f} | "
                 f"{s['val_documents']} + {s['test_documents']} |")
    L.append("")
    L.append("## Licences\n")
    L.append("As stated in each package's `/usr/share/doc/<package>/copyright` (summarised; that file is the "
             "authority):\n")
    for p in pkgs:
        L.append(f"- `{p}`: {SOURCES[p]['licence']}.")
    L.append("")
    L.append("The model's weights are a statistical derivative of this text. They are distributed under the terms "
             "of the licences above, with attribution to their authors: the Python Software Foundation, the "
             "PostgreSQL Global Development Group, the Linux man-pages project and its contributors, Osamu Aoki "
             "and the Debian Reference contributors, Raphaël Hertzog and Roland Mas, the Git project, the Debian "
             "Policy editors and the FHS authors, the Django Software Foundation, the Linux kernel "
             "documentation authors, and Larry Wall and the Perl 5 Porters. Where a licence is "
             "copyleft (the GPL versions, CC-BY-SA-3.0), treat the weights as covered by it.\n")
    with open(fn, "w") as f:
        f.write("\n".join(L))


if __name__ == "__main__":
    main()
