"""Seeded files of many types, as bytes with their true type, for the file-type classifier benchmark.

Text formats (source code, markup, data) are assembled from word lists and templates; binary formats
are written by the standard library, numpy and Pillow from seeded content (images of random shapes,
archives of generated text, tones as WAV), with timestamps fixed so the bytes depend on the seed
only. Labels are magika's content-type names.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pickle
import tarfile
import time
import wave
import zipfile

import numpy as np
from PIL import Image, ImageDraw

_WORDS = ("alpha", "buffer", "count", "delta", "error", "frame", "group", "handle", "index", "json", "key",
          "limit", "model", "name", "offset", "parent", "query", "result", "size", "token", "user", "value",
          "width", "config", "item", "order", "price", "total", "status", "path", "table", "record")
_PROSE = ("the", "system", "reads", "each", "file", "and", "writes", "a", "report", "for", "every", "user",
          "when", "new", "data", "arrives", "from", "server", "with", "small", "changes", "in", "its", "format")


def _w(rng, k=1, sep="_"):
    return sep.join(_WORDS[int(rng.integers(len(_WORDS)))] for _ in range(k))


def _sentence(rng, lo=5, hi=14):
    s = " ".join(_PROSE[int(rng.integers(len(_PROSE)))] for _ in range(int(rng.integers(lo, hi))))
    return s[0].upper() + s[1:] + "."


def _n(rng, lo, hi):
    return int(rng.integers(lo, hi))


def _python(rng):
    out = ["import os", "import sys", f"from collections import {rng.choice(['defaultdict', 'Counter'])}", ""]
    for _ in range(_n(rng, 2, 6)):
        args = ", ".join(_w(rng) for _ in range(_n(rng, 1, 4)))
        out += [f"def {_w(rng, 2)}({args}):", f'    """{_sentence(rng)}"""',
                f"    {_w(rng)} = [{_w(rng)} for {_w(rng)} in range({_n(rng, 2, 99)})]",
                f"    if {_w(rng)} is None:", f"        return {_n(rng, 0, 9)}",
                f"    return {_w(rng)} + {_n(rng, 1, 50)}", ""]
    out += ['if __name__ == "__main__":', f"    {_w(rng, 2)}(sys.argv[1:])"]
    return "\n".join(out)


def _javascript(rng):
    out = ["'use strict';", f"const {_w(rng)} = require('{_w(rng)}');", ""]
    for _ in range(_n(rng, 2, 6)):
        args = ", ".join(_w(rng) for _ in range(_n(rng, 1, 4)))
        out += [f"function {_w(rng, 2, '')}({args}) {{", f"  // {_sentence(rng)}",
                f"  let {_w(rng)} = {args.split(', ')[0]}.map((x) => x * {_n(rng, 2, 9)});",
                f"  if ({_w(rng)} === undefined) {{ return null; }}", f"  return {_w(rng)}.length;", "}", ""]
    out.append(f"module.exports = {{ {_w(rng)} }};")
    return "\n".join(out)


def _c(rng):
    out = ["#include <stdio.h>", "#include <stdlib.h>", f"#define {_w(rng).upper()} {_n(rng, 1, 256)}", ""]
    for _ in range(_n(rng, 2, 5)):
        out += [f"static int {_w(rng, 2)}(int *{_w(rng)}, size_t n) {{", "    int acc = 0;",
                "    for (size_t i = 0; i < n; i++) {", f"        acc += {_w(rng)}[i] * {_n(rng, 2, 9)};",
                "    }", "    return acc;", "}", ""]
    out += ["int main(int argc, char **argv) {", f'    printf("%d\\n", {_n(rng, 0, 99)});', "    return 0;", "}"]
    return "\n".join(out)


def _java(rng):
    cls = _w(rng, 2, "").capitalize()
    out = [f"package com.example.{_w(rng)};", "", "import java.util.List;", "import java.util.ArrayList;", "",
           f"public class {cls} {{"]
    for _ in range(_n(rng, 2, 5)):
        out += [f"    private int {_w(rng)} = {_n(rng, 0, 99)};", "",
                f"    public List<String> {_w(rng, 2, '')}(String {_w(rng)}) {{",
                "        List<String> out = new ArrayList<>();", f"        out.add(\"{_w(rng)}\");",
                "        return out;", "    }"]
    out.append("}")
    return "\n".join(out)


def _shell(rng):
    out = ["#!/bin/bash", "set -euo pipefail", f'{_w(rng).upper()}="${{1:-{_w(rng)}}}"', ""]
    for _ in range(_n(rng, 3, 8)):
        out += [f'if [ -f "/etc/{_w(rng)}.conf" ]; then', f'    echo "{_sentence(rng)}"',
                f"    grep -r {_w(rng)} /var/log | wc -l", "fi"]
    return "\n".join(out)


def _sql(rng):
    t = _w(rng)
    cols = [_w(rng) for _ in range(_n(rng, 2, 6))]
    out = [f"CREATE TABLE {t} (", "    id INTEGER PRIMARY KEY,"]
    out += [f"    {c} VARCHAR({_n(rng, 8, 255)})," for c in cols[:-1]] + [f"    {cols[-1]} INTEGER NOT NULL", ");"]
    for _ in range(_n(rng, 3, 10)):
        out.append(f"INSERT INTO {t} (id, {cols[0]}) VALUES ({_n(rng, 1, 999)}, '{_w(rng)}');")
    out.append(f"SELECT {', '.join(cols)} FROM {t} WHERE {cols[0]} LIKE '%{_w(rng)}%' ORDER BY id;")
    return "\n".join(out)


def _record(rng):
    return {_w(rng): (_n(rng, 0, 9999) if rng.random() < 0.5 else _w(rng, 2, " ")) for _ in range(_n(rng, 2, 6))}


def _json(rng):
    return json.dumps({"items": [_record(rng) for _ in range(_n(rng, 2, 12))], _w(rng): _sentence(rng)},
                      indent=int(rng.choice([2, 4])))


def _csv(rng, sep=","):
    cols = [_w(rng) for _ in range(_n(rng, 3, 8))]
    rows = [sep.join(cols)] + [sep.join(str(_n(rng, 0, 9999)) if rng.random() < 0.6 else _w(rng) for _ in cols)
                               for _ in range(_n(rng, 10, 60))]
    return "\n".join(rows)


def _html(rng):
    body = "\n".join(f"  <p class=\"{_w(rng)}\">{_sentence(rng)}</p>" for _ in range(_n(rng, 2, 8)))
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n  <meta charset=\"utf-8\">\n  <title>{_w(rng, 2, ' ')}"
            f"</title>\n  <link rel=\"stylesheet\" href=\"{_w(rng)}.css\">\n</head>\n<body>\n"
            f"  <h1>{_sentence(rng, 2, 5)}</h1>\n{body}\n  <a href=\"/{_w(rng)}\">{_w(rng)}</a>\n</body>\n</html>")


def _xml(rng):
    items = "\n".join(f"  <item id=\"{_n(rng, 1, 999)}\" name=\"{_w(rng)}\">{_w(rng, 2, ' ')}</item>"
                      for _ in range(_n(rng, 3, 15)))
    root = _w(rng)
    return f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{root}>\n{items}\n</{root}>"


def _css(rng):
    rules = []
    for _ in range(_n(rng, 3, 10)):
        rules.append(f".{_w(rng, 2, '-')} {{\n  color: #{_n(rng, 0, 0xFFFFFF):06x};\n  margin: {_n(rng, 0, 40)}px;"
                     f"\n  font-size: {_n(rng, 8, 30)}px;\n}}")
    return "\n\n".join(rules)


def _markdown(rng):
    out = [f"# {_sentence(rng, 2, 5)}", ""]
    for _ in range(_n(rng, 2, 5)):
        out += [f"## {_w(rng, 2, ' ').title()}", "", _sentence(rng) + " " + _sentence(rng), "",
                f"- {_w(rng)}: {_sentence(rng, 3, 6)}", f"- **{_w(rng)}** `{_w(rng)}()`", ""]
    return "\n".join(out)


def _yaml(rng):
    out = [f"{_w(rng)}:"]
    for _ in range(_n(rng, 3, 10)):
        out.append(f"  {_w(rng)}: {_n(rng, 0, 999) if rng.random() < 0.5 else _w(rng)}")
    out += [f"{_w(rng)}:"] + [f"  - {_w(rng)}" for _ in range(_n(rng, 2, 6))]
    return "\n".join(out)


def _ini(rng):
    out = []
    for _ in range(_n(rng, 2, 5)):
        out += [f"[{_w(rng)}]"] + [f"{_w(rng)} = {_n(rng, 0, 999) if rng.random() < 0.5 else _w(rng)}"
                                   for _ in range(_n(rng, 2, 6))] + [""]
    return "\n".join(out)


def _latex(rng):
    body = "\n\n".join(_sentence(rng) + " " + _sentence(rng) for _ in range(_n(rng, 2, 5)))
    return ("\\documentclass{article}\n\\usepackage{amsmath}\n\\begin{document}\n"
            f"\\section{{{_w(rng, 2, ' ')}}}\n{body}\n\\begin{{equation}}\n  x = \\frac{{{_n(rng, 1, 9)}}}{{y}}\n"
            "\\end{equation}\n\\end{document}")


TEXT = {"python": _python, "javascript": _javascript, "c": _c, "java": _java, "shell": _shell, "sql": _sql,
        "json": _json, "csv": _csv, "tsv": lambda rng: _csv(rng, "\t"), "html": _html, "xml": _xml, "css": _css,
        "markdown": _markdown, "yaml": _yaml, "ini": _ini, "latex": _latex}


def _picture(rng) -> Image.Image:
    w, h = _n(rng, 32, 200), _n(rng, 32, 200)
    im = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(0, 256, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(_n(rng, 2, 12)):
        x0, y0 = _n(rng, 0, w), _n(rng, 0, h)
        box = (x0, y0, x0 + _n(rng, 1, w), y0 + _n(rng, 1, h))
        d.rectangle(box, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return im


FIXED_TIME = time.gmtime(1577836800)  # 2020-01-01, as the archives


def _image(fmt: str):
    def make(rng):
        buf = io.BytesIO()
        # a PDF's info dictionary holds its creation and modification times: fixed, as the archives' are
        when = {"creationDate": FIXED_TIME, "modDate": FIXED_TIME} if fmt == "PDF" else {}
        _picture(rng).save(buf, format=fmt, **when)
        return buf.getvalue()
    return make


def _archive(kind: str):
    def make(rng):
        members = {f"{_w(rng)}_{i}.txt": (_sentence(rng) * _n(rng, 1, 20)).encode() for i in range(_n(rng, 1, 5))}
        buf = io.BytesIO()
        if kind == "zip":
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
                for name, data in members.items():
                    z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
        elif kind == "tar":
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
                for name, data in members.items():
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), 0
                    t.addfile(info, io.BytesIO(data))
        else:
            data = b"".join(members.values())
            return {"gzip": lambda: gzip.compress(data, mtime=0), "bzip": lambda: bz2.compress(data),
                    "xz": lambda: lzma.compress(data)}[kind]()
        return buf.getvalue()
    return make


def _wav(rng):
    n = _n(rng, 4000, 40000)
    t = np.arange(n) / 16000
    x = np.sin(2 * np.pi * rng.uniform(100, 2000) * t) * rng.uniform(0.1, 0.9)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _npy(rng):
    buf = io.BytesIO()
    np.save(buf, rng.standard_normal((_n(rng, 2, 40), _n(rng, 2, 40))).astype(rng.choice(["<f4", "<f8", "<i4"])))
    return buf.getvalue()


def _pickle(rng):
    return pickle.dumps([_record(rng) for _ in range(_n(rng, 2, 30))], protocol=int(rng.integers(2, 6)))


BINARY = {"png": _image("PNG"), "jpeg": _image("JPEG"), "gif": _image("GIF"), "bmp": _image("BMP"),
          "tiff": _image("TIFF"), "webp": _image("WEBP"), "pdf": _image("PDF"), "zip": _archive("zip"),
          "tar": _archive("tar"), "gzip": _archive("gzip"), "bzip": _archive("bzip"), "xz": _archive("xz"),
          "wav": _wav, "npy": _npy, "pickle": _pickle}
KINDS = tuple(TEXT) + tuple(BINARY)


def sample_file(rng: np.random.Generator, i: int) -> tuple[bytes, str]:
    """File ``i`` of a set: the types take turns (``i`` modulo their number), so any 31 consecutive
    samples hold one of each; the content is drawn from ``rng``."""
    kind = KINDS[i % len(KINDS)]
    if kind in TEXT:
        return TEXT[kind](rng).encode(), kind
    return BINARY[kind](rng), kind
