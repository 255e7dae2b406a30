"""Seeded text-line crops, like a text detector's output, for the OCR examples and benchmarks.

Pure functions of a ``numpy.random.Generator``: the same seed gives the same pixels. Images are
uint8 **BGR** arrays, what rapidocr receives from ``cv2.imread``. Fonts are the system DejaVu
faces (Sans/Serif/Mono, regular/bold/oblique); where they are missing, Pillow's built-in scalable
font stands in (other pixels, same kind of data).

The text is digits, Latin letters and ASCII punctuation only: no CJK font is assumed, and all of
these exist in the PP-OCRv4 recognizer's charset.
"""

from __future__ import annotations

import string
from functools import cache
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = [
    "DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf", "DejaVuSansCondensed.ttf",
    "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf", "DejaVuSerif-Italic.ttf",
    "DejaVuSansMono.ttf", "DejaVuSansMono-Bold.ttf",
]

# Punctuation the Chinese recognizer reads reliably as its ASCII form.  Quotes,
# backslash, backtick, '^', '~', '|' and '_' are dropped: they are rare in
# real text, and the model often emits a full-width or look-alike symbol for
# them, which would measure charset conventions rather than quantization.
PUNCT = ".,:;-!?()/%+&#=$@*[]"
WORD_CHARS = string.ascii_letters + string.digits


@cache
def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / name
    if not path.is_file():  # no DejaVu here: Pillow's own scalable font (Pillow >= 10.1)
        return ImageFont.load_default(size)
    return ImageFont.truetype(str(path), size)


def random_text(rng: np.random.Generator, max_words: int = 4) -> str:
    """Words of letters/digits with occasional punctuation, single-spaced."""
    words = []
    for _ in range(int(rng.integers(1, max_words + 1))):
        kind = rng.random()
        n = int(rng.integers(2, 9))
        if kind < 0.45:      # lowercase word, maybe capitalised
            w = "".join(rng.choice(list(string.ascii_lowercase), n))
            if rng.random() < 0.4:
                w = w.capitalize()
        elif kind < 0.6:     # upper case
            w = "".join(rng.choice(list(string.ascii_uppercase), n))
        elif kind < 0.8:     # number, maybe with separators
            w = "".join(rng.choice(list(string.digits), n))
            if rng.random() < 0.4 and n > 3:
                i = int(rng.integers(1, n - 1))
                w = w[:i] + str(rng.choice(list(".,:-/"))) + w[i:]
        else:                # mixed alphanumeric code
            w = "".join(rng.choice(list(WORD_CHARS), n))
        if rng.random() < 0.3:
            w += str(rng.choice(list(PUNCT)))
        words.append(w)
    return " ".join(words)


def _ink_and_paper(rng: np.random.Generator) -> tuple[int, int]:
    """Dark text on light background with random contrast."""
    paper = int(rng.integers(170, 256))
    ink = int(rng.integers(0, max(1, paper - 110)))
    return ink, paper


def degrade(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mild blur, Gaussian noise and a colour tint, like a photographed scan."""
    out = img.astype(np.float32)
    if rng.random() < 0.5:
        k = int(rng.choice([3, 5]))
        out = cv2.GaussianBlur(out, (k, k), float(rng.uniform(0.3, 1.0)))
    out = out * rng.uniform(0.9, 1.05, size=3).astype(np.float32)  # tint
    out += rng.normal(0, rng.uniform(0, 8), size=out.shape).astype(np.float32)
    return np.clip(out, 0, 255).astype(np.uint8)


def text_line(rng: np.random.Generator, text: str | None = None,
              max_aspect: float | None = None) -> tuple[np.ndarray, str]:
    """Render one text line as a tight crop (as a detector crop would be).

    If ``max_aspect`` is given, trailing characters are removed until
    width/height <= max_aspect, so the crop fits a fixed recognizer width
    without being squeezed.  Returns (BGR image, text actually rendered).
    """
    text = random_text(rng) if text is None else text
    f = font(str(rng.choice(FONT_FILES)), int(rng.integers(20, 44)))
    ink, paper = _ink_and_paper(rng)
    while True:
        x1 = f.getbbox(text)[2]
        asc, desc = f.getmetrics()
        h = asc + desc
        mx = int(rng.integers(2, 10))
        my = int(rng.integers(2, max(3, h // 4)))
        W, H = x1 + 2 * mx, h + 2 * my
        if max_aspect is None or W / H <= max_aspect or len(text) <= 1:
            break
        text = text[:-1].rstrip()
    im = Image.new("L", (W, H), paper)
    ImageDraw.Draw(im).text((mx, my), text, fill=ink, font=f)
    bgr = cv2.cvtColor(np.asarray(im), cv2.COLOR_GRAY2BGR)
    return degrade(bgr, rng), text
