"""Deterministic synthetic image rendering for the real-model benchmarks.

Everything here is a pure function of a ``numpy.random.Generator`` so the
benchmark data are reproducible bit-for-bit from a seed; no files are read
except the system DejaVu fonts.  Images are returned as uint8 **BGR** arrays
because that is what rapidocr and nudenet receive from ``cv2.imread``.

There is no CJK font on this machine (``fc-list`` shows DejaVu only), so the
OCR text is restricted to digits, Latin letters and ASCII punctuation, all of
which exist in the PP-OCRv4 recognizer charset.
"""
from __future__ import annotations

import string
from functools import lru_cache
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


@lru_cache(maxsize=None)
def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(FONT_DIR / name), size)


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
        x0, y0, x1, y1 = f.getbbox(text)
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


def text_page(rng: np.random.Generator, size: tuple[int, int] = (640, 640),
              n_lines: tuple[int, int] = (3, 9)):
    """A page with several non-overlapping text lines at random places.

    Returns (BGR image, list of (x0, y0, x1, y1) ink boxes, list of texts).
    """
    W, H = size
    paper = int(rng.integers(190, 256))
    # low-frequency shading so the background is not a flat constant
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    shade = (rng.uniform(-20, 0) * xx / W + rng.uniform(-20, 0) * yy / H)
    base = np.clip(paper + shade, 0, 255).astype(np.uint8)
    im = Image.fromarray(base, "L")
    d = ImageDraw.Draw(im)
    boxes, texts = [], []
    taken = np.zeros((H, W), bool)
    for _ in range(int(rng.integers(*n_lines))):
        for _attempt in range(20):
            text = random_text(rng, max_words=5)
            f = font(str(rng.choice(FONT_FILES)), int(rng.integers(16, 40)))
            x0, y0, x1, y1 = f.getbbox(text)
            if x1 - x0 >= W - 20:
                continue
            px = int(rng.integers(10, W - (x1 - x0) - 10))
            py = int(rng.integers(10, H - (y1 - y0) - 10))
            b = (px + x0, py + y0, px + x1, py + y1)
            pad = 8
            if taken[max(0, b[1] - pad):b[3] + pad, max(0, b[0] - pad):b[2] + pad].any():
                continue
            taken[b[1]:b[3], b[0]:b[2]] = True
            ink = int(rng.integers(0, 90))
            d.text((px, py), text, fill=ink, font=f)
            boxes.append(b)
            texts.append(text)
            break
    bgr = cv2.cvtColor(np.asarray(im), cv2.COLOR_GRAY2BGR)
    return degrade(bgr, rng), boxes, texts


def scene(rng: np.random.Generator, size: tuple[int, int] = (400, 300)) -> np.ndarray:
    """A cluttered synthetic colour scene for the YOLOv8 detector.

    Gradient background + value noise texture, skin-toned blobs arranged as
    crude figures (head/torso/limbs), random coloured shapes and some text.
    No real photographs of people are available offline, so this only aims to
    produce non-trivial activations and some detections, not meaningful ones.
    """
    W, H = size
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = (xx / W * rng.uniform(-1, 1) + yy / H * rng.uniform(-1, 1))
    t = (t - t.min()) / (np.ptp(t) + 1e-6)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    coarse = rng.normal(0, 25, size=(H // 16 + 1, W // 16 + 1, 3)).astype(np.float32)
    img += cv2.resize(coarse, (W, H), interpolation=cv2.INTER_CUBIC)
    img = np.clip(img, 0, 255).astype(np.uint8).copy()

    for _ in range(int(rng.integers(3, 9))):          # clutter shapes
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        x, y = int(rng.integers(0, W)), int(rng.integers(0, H))
        if rng.random() < 0.5:
            cv2.rectangle(img, (x, y), (x + int(rng.integers(10, 120)), y + int(rng.integers(10, 120))), col, -1)
        else:
            cv2.line(img, (x, y), (int(rng.integers(0, W)), int(rng.integers(0, H))), col, int(rng.integers(1, 8)))

    for _ in range(int(rng.integers(1, 4))):          # crude skin-toned figures
        skin = np.array([rng.uniform(60, 150), rng.uniform(110, 190), rng.uniform(170, 255)])  # BGR
        cx, cy = int(rng.integers(40, W - 40)), int(rng.integers(30, H - 60))
        s = float(rng.uniform(0.5, 1.6))
        col = tuple(int(v) for v in skin)
        dark = tuple(int(v * 0.6) for v in skin)
        cv2.ellipse(img, (cx, cy), (int(14 * s), int(18 * s)), 0, 0, 360, col, -1)           # head
        cv2.circle(img, (cx - int(5 * s), cy - int(3 * s)), max(1, int(2 * s)), (30, 30, 30), -1)
        cv2.circle(img, (cx + int(5 * s), cy - int(3 * s)), max(1, int(2 * s)), (30, 30, 30), -1)
        cv2.ellipse(img, (cx, cy + int(8 * s)), (int(5 * s), int(2 * s)), 0, 0, 180, dark, -1)
        cv2.ellipse(img, (cx, cy + int(60 * s)), (int(24 * s), int(40 * s)), 0, 0, 360, col, -1)  # torso
        for sx in (-1, 1):                                                                        # limbs
            cv2.line(img, (cx + sx * int(20 * s), cy + int(35 * s)),
                     (cx + sx * int(45 * s), cy + int(80 * s)), col, max(2, int(8 * s)))
        if rng.random() < 0.6:  # clothing band over the torso
            cloth = tuple(int(v) for v in rng.integers(0, 256, 3))
            cv2.rectangle(img, (cx - int(24 * s), cy + int(55 * s)), (cx + int(24 * s), cy + int(100 * s)), cloth, -1)

    if rng.random() < 0.5:
        cv2.putText(img, random_text(rng, 2), (int(rng.integers(0, W // 2)), int(rng.integers(20, H))),
                    cv2.FONT_HERSHEY_SIMPLEX, float(rng.uniform(0.5, 1.5)), (0, 0, 0), 2)
    img = cv2.GaussianBlur(img, (3, 3), 0.8)
    noise = rng.normal(0, 6, img.shape)
    return np.clip(img + noise, 0, 255).astype(np.uint8)
