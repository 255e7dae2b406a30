"""Deterministic synthetic images and sentences for the real-model benchmarks.

Everything here is a pure function of a ``numpy.random.Generator`` so the
benchmark data are reproducible bit-for-bit from a seed; no files are read
except the system DejaVu fonts and, for :func:`photo_scene`, photographs that ship inside
scikit-image and matplotlib.  Images are returned as uint8 **BGR** arrays
because that is what rapidocr and nudenet receive from ``cv2.imread``.

There is no CJK font on this machine (``fc-list`` shows DejaVu only), so the
OCR text is restricted to digits, Latin letters and ASCII punctuation, all of
which exist in the PP-OCRv4 recognizer charset.

``sentence`` makes English sentences for the sentence-embedding model the same way
(word lists and templates, no corpus).
"""
from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw

# Text-line crops live in the package (the `qnnx demo` uses them too); re-exported for the tasks.
from qnnx.examples.text_lines import (  # noqa: F401
    FONT_DIR,
    FONT_FILES,
    PUNCT,
    WORD_CHARS,
    degrade,
    font,
    random_text,
    text_line,
)


def text_page(rng: np.random.Generator, size: tuple[int, int] = (640, 640),
              n_lines: tuple[int, int] = (3, 9)):
    """A page with several non-overlapping text lines at random places.

    Returns (BGR image, list of (x0, y0, x1, y1) boxes, list of texts).  A
    box spans the ink horizontally and the font's ascent+descent vertically,
    i.e. a text-line box like detection datasets annotate; tight ink boxes
    of lowercase-only words are much flatter than DB's unclipped boxes and
    would fail IoU 0.5 for reasons unrelated to the model.
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
            f = font(str(rng.choice(FONT_FILES)), int(rng.integers(12, 40)))
            x0, _, x1, _ = f.getbbox(text)
            lh = sum(f.getmetrics())  # ascent + descent: the text-line box, not the ink box
            if x1 - x0 >= W - 20:
                continue
            px = int(rng.integers(10, W - (x1 - x0) - 10))
            py = int(rng.integers(10, H - lh - 10))
            b = (px + x0, py, px + x1, py + lh)
            pad = 8
            if taken[max(0, b[1] - pad):b[3] + pad, max(0, b[0] - pad):b[2] + pad].any():
                continue
            taken[b[1]:b[3], b[0]:b[2]] = True
            ink = int(rng.integers(0, paper - 80))  # down to low contrast
            d.text((px, py), text, fill=ink, font=f)
            boxes.append(b)
            texts.append(text)
            break
    bgr = cv2.cvtColor(np.asarray(im), cv2.COLOR_GRAY2BGR)
    return degrade(bgr, rng), boxes, texts


def _shaded_fill(img: np.ndarray, mask: np.ndarray, color) -> None:
    """Fill ``mask`` with ``color`` shaded by the distance to its border, so
    limbs and heads look rounded rather than flat (matters to the detector)."""
    d = cv2.distanceTransform(mask, cv2.DIST_L2, 5)
    d = d / d.max() if d.max() > 0 else d
    col = np.asarray(color, np.float32)[None, None] * (0.55 + 0.45 * np.sqrt(d))[..., None]
    m = mask.astype(bool)
    img[m] = np.clip(col[m], 0, 255)


def _figure(img: np.ndarray, rng: np.random.Generator, cx: int, cy: int, s: float) -> None:
    """A crude standing person: shaded skin-toned body with a face, hair,
    feet, and optionally clothing patches over chest/hips."""
    H, W = img.shape[:2]
    skin = (rng.uniform(60, 150), rng.uniform(100, 190), rng.uniform(160, 255))  # BGR
    P = lambda dx, dy: (cx + int(dx * s), cy + int(dy * s))
    mask = np.zeros((H, W), np.uint8)
    cv2.ellipse(mask, P(0, 0), (int(14 * s), int(18 * s)), 0, 0, 360, 1, -1)         # head
    cv2.rectangle(mask, P(-5, 14), P(5, 26), 1, -1)                                    # neck
    cv2.ellipse(mask, P(0, 62), (int(26 * s), int(40 * s)), 0, 0, 360, 1, -1)         # torso
    for sx in (-1, 1):
        cv2.line(mask, P(sx * 22, 34), P(sx * 40, 90), 1, max(2, int(10 * s)))         # arms
        cv2.line(mask, P(sx * 12, 95), P(sx * 16, 160), 1, max(2, int(13 * s)))        # legs
        cv2.ellipse(mask, P(sx * 20, 163), (int(9 * s), int(4 * s)), 0, 0, 360, 1, -1)  # feet
    _shaded_fill(img, mask, skin)
    hair = tuple(int(v) for v in rng.integers(0, 90, 3))
    cv2.ellipse(img, P(0, -8), (int(15 * s), int(11 * s)), 0, 180, 360, hair, -1)
    for sx in (-1, 1):
        cv2.circle(img, P(sx * 5, -2), max(1, int(2 * s)), (40, 40, 40), -1)             # eyes
    cv2.line(img, P(0, 0), P(0, 5), tuple(v * 0.7 for v in skin), 1)                    # nose
    cv2.ellipse(img, P(0, 9), (int(5 * s), int(2 * s)), 0, 0, 180, (60, 60, 150), -1)  # mouth
    if rng.random() < 0.5:
        cv2.rectangle(img, P(-27, 75), P(27, 105), tuple(int(v) for v in rng.integers(0, 256, 3)), -1)
    if rng.random() < 0.4:
        cv2.ellipse(img, P(0, 45), (int(25 * s), int(14 * s)), 0, 0, 360,
                    tuple(int(v) for v in rng.integers(0, 256, 3)), -1)


def scene(rng: np.random.Generator, size: tuple[int, int] = (400, 300)) -> np.ndarray:
    """A cluttered synthetic colour scene for the YOLOv8 body-part detector.

    Gradient background + value-noise texture, random rectangles/lines/text
    and 1-2 crude shaded human figures.  No photographs of people are
    available offline, so this only aims at non-trivial activations and a
    reasonable number of detections (~1 per image at nudenet's 0.2 threshold,
    mostly FACE_*, some FEET/ARMPITS), not at meaningful ones.
    """
    W, H = size
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = xx / W * rng.uniform(-1, 1) + yy / H * rng.uniform(-1, 1)
    t = (t - t.min()) / (np.ptp(t) + 1e-6)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    coarse = rng.normal(0, 25, size=(H // 16 + 1, W // 16 + 1, 3)).astype(np.float32)
    img = np.clip(img + cv2.resize(coarse, (W, H), interpolation=cv2.INTER_CUBIC), 0, 255).astype(np.uint8)

    for _ in range(int(rng.integers(3, 9))):          # clutter shapes
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        x, y = int(rng.integers(0, W)), int(rng.integers(0, H))
        if rng.random() < 0.5:
            cv2.rectangle(img, (x, y), (x + int(rng.integers(10, 120)), y + int(rng.integers(10, 120))), col, -1)
        else:
            cv2.line(img, (x, y), (int(rng.integers(0, W)), int(rng.integers(0, H))), col, int(rng.integers(1, 8)))
    if rng.random() < 0.5:
        cv2.putText(img, random_text(rng, 2), (int(rng.integers(0, W // 2)), int(rng.integers(20, H))),
                    cv2.FONT_HERSHEY_SIMPLEX, float(rng.uniform(0.5, 1.5)), (0, 0, 0), 2)
    for _ in range(int(rng.integers(1, 3))):
        s = float(rng.uniform(0.6, 1.5))
        _figure(img, rng, int(rng.integers(40, W - 40)), int(rng.integers(20, max(21, H - int(150 * s)))), s)
    img = cv2.GaussianBlur(img, (3, 3), 0.8) + rng.normal(0, 6, img.shape)  # float64 from here
    return np.clip(img, 0, 255).astype(np.uint8)


def cartoon_faces(rng: np.random.Generator, size: tuple[int, int] = (480, 360)) -> np.ndarray:
    """1-3 drawn faces (a skin-toned oval with eyes, brows, nose and mouth, 50-150 px wide) on a plain
    background, lightly blurred: a face detector's calibration images that are not photographs."""
    W, H = size
    im = Image.new("RGB", (W, H), tuple(int(v) for v in rng.integers(0, 256, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(1, 4))):
        w = int(rng.integers(50, 151))
        h = int(w * 1.3)
        x0, y0 = int(rng.integers(0, W - w)), int(rng.integers(0, H - h))
        skin = (int(rng.integers(150, 256)), int(rng.integers(100, 201)), int(rng.integers(80, 171)))  # RGB
        d.ellipse([x0, y0, x0 + w, y0 + h], fill=skin)
        for ex in (0.3, 0.7):
            cx, cy = x0 + ex * w, y0 + 0.4 * h
            d.ellipse([cx - w * .08, cy - w * .05, cx + w * .08, cy + w * .05], fill=(255, 255, 255))
            d.ellipse([cx - w * .035, cy - w * .035, cx + w * .035, cy + w * .035], fill=(40, 30, 20))
            d.line([cx - w * .1, cy - w * .12, cx + w * .1, cy - w * .12], fill=(60, 40, 20), width=max(2, w // 25))
        d.polygon([(x0 + .5 * w, y0 + .45 * h), (x0 + .45 * w, y0 + .62 * h), (x0 + .55 * w, y0 + .62 * h)],
                  fill=tuple(max(0, c - 40) for c in skin))
        d.arc([x0 + .3 * w, y0 + .6 * h, x0 + .7 * w, y0 + .8 * h], 20, 160, fill=(150, 40, 40), width=max(2, w // 20))
    img = np.asarray(im)[..., ::-1].astype(np.float32)  # BGR
    img = cv2.GaussianBlur(img, (5, 5), 1.0) + rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- photographs
# The only photographs of people in installed packages: scikit-image's astronaut (Eileen Collins) and
# cameraman, matplotlib's Grace Hopper. Backgrounds: scikit-image's other natural photographs.
PEOPLE = (("skimage", "data/astronaut.png"), ("skimage", "data/camera.png"),
          ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"))
BACKGROUNDS = tuple(("skimage", f"data/{f}") for f in (
    "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg", "brick.png", "grass.png", "gravel.png"))


@cache
def packaged_photo(package: str, relpath: str) -> np.ndarray:
    """A photograph shipped inside an installed package, as uint8 BGR (grey ones as 3 channels)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"the photo benchmark needs {package} installed (pip install -e '.[bench]')")
    path = Path(spec.submodule_search_locations[0]) / relpath
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise SystemExit(f"{path}: not a readable image")
    return img


def photo_scene(rng: np.random.Generator, size: tuple[int, int] = (400, 300)) -> np.ndarray:
    """A random crop of a real background photograph with 1-2 real portraits pasted in.

    Each portrait is scaled to 45-100% of the scene height, maybe mirrored, shifted in brightness
    and contrast, and may run off an edge; light sensor noise on top. The faces are real, so
    nudenet's detections on these are confident, unlike on :func:`scene`'s drawn figures.
    """
    W, H = size
    bg = packaged_photo(*BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))])
    s = max(W / bg.shape[1], H / bg.shape[0]) * float(rng.uniform(1.0, 1.6))
    bg = cv2.resize(bg, (max(W, round(bg.shape[1] * s)), max(H, round(bg.shape[0] * s))), interpolation=cv2.INTER_AREA)
    y0, x0 = int(rng.integers(0, bg.shape[0] - H + 1)), int(rng.integers(0, bg.shape[1] - W + 1))
    img = bg[y0:y0 + H, x0:x0 + W].astype(np.float32)
    for _ in range(int(rng.integers(1, 3))):
        p = packaged_photo(*PEOPLE[int(rng.integers(len(PEOPLE)))])
        h = int(H * rng.uniform(0.45, 1.0))
        w = max(1, round(p.shape[1] * h / p.shape[0]))
        p = cv2.resize(p, (w, h), interpolation=cv2.INTER_AREA).astype(np.float32)
        if rng.random() < 0.5:
            p = p[:, ::-1]
        p = (p - 128) * float(rng.uniform(0.75, 1.25)) + 128 + float(rng.uniform(-30, 30))
        x, y = int(rng.integers(-w // 4, W - 3 * w // 4)), int(rng.integers(-h // 8, H - 7 * h // 8 + 1))
        sx, sy = max(0, -x), max(0, -y)
        ex, ey = min(w, W - x), min(h, H - y)
        img[y + sy:y + ey, x + sx:x + ex] = p[sy:ey, sx:ex]
    img = img + rng.normal(0, 4, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- sentences
# No text corpus ships offline; the sentence-embedding benchmark needs varied, plausible English
# of about 5-60 word-piece tokens, built from word lists and templates.
_NOUNS = ("river", "engineer", "market", "window", "student", "garden", "company", "bridge", "doctor", "computer",
          "village", "teacher", "storm", "library", "museum", "kitchen", "train", "mountain", "report", "planet",
          "server", "recipe", "budget", "orchestra", "harbor", "vaccine", "algorithm", "festival", "farmer", "camera")
_ADJS = ("old", "quiet", "bright", "expensive", "broken", "famous", "tiny", "crowded", "ancient", "modern", "rainy",
         "careful", "strange", "local", "digital", "heavy", "friendly", "remote", "green", "complex")
_VERBS = (("open", "opened"), ("visit", "visited"), ("repair", "repaired"), ("describe", "described"),
          ("paint", "painted"), ("measure", "measured"), ("ignore", "ignored"), ("praise", "praised"),
          ("design", "designed"), ("close", "closed"), ("study", "studied"), ("sell", "sold"), ("find", "found"),
          ("carry", "carried"), ("explain", "explained"), ("clean", "cleaned"), ("test", "tested"),
          ("delay", "delayed"))
_ADVS = ("slowly", "yesterday", "again", "carefully", "at night", "without warning", "for hours", "in the morning",
         "every week", "quickly")
_PLACES = ("in Paris", "near the station", "on the third floor", "behind the school", "across the valley",
           "at the airport", "in a small town", "under the old bridge", "by the sea", "in the north")
_NAMES = ("Maria", "John", "Aiko", "Pedro", "Fatima", "Liam", "Olga", "Chen", "Amara", "Lukas")
_TOPICS = ("climate change", "machine learning", "football", "the stock market", "medieval history",
           "renewable energy", "jazz music", "public transport", "space travel", "healthy food")


def _clause(rng: np.random.Generator, question: bool) -> str:
    c = lambda xs: xs[int(rng.integers(len(xs)))]
    if question:
        return f"why did the {c(_NOUNS)} {c(_VERBS)[0]} the {c(_ADJS)} {c(_NOUNS)}"
    kind = int(rng.integers(5))
    if kind == 0:
        return f"the {c(_ADJS)} {c(_NOUNS)} {c(_VERBS)[1]} the {c(_NOUNS)} {c(_PLACES)}"
    if kind == 1:
        return f"{c(_NAMES)} {c(_VERBS)[1]} a {c(_ADJS)} {c(_NOUNS)} {c(_ADVS)}"
    if kind == 2:
        return f"{c(_NAMES)} wrote {int(rng.integers(2, 500))} pages about {c(_TOPICS)} {c(_PLACES)}"
    if kind == 3:
        return f"{c(_TOPICS)} is {c(_ADJS)}"
    return f"a {c(_NOUNS)} was {c(_VERBS)[1]} by {c(_NAMES)} {c(_ADVS)}, and the {c(_NOUNS)} was {c(_ADJS)}"


def sentence(rng: np.random.Generator) -> str:
    """A question, or 1-4 clauses joined with conjunctions: about 5 to 60 word-piece tokens."""
    if rng.random() < 0.1:
        text = _clause(rng, question=True)
        return text[0].upper() + text[1:] + "?"
    joins = (", and ", " because ", " while ", "; ", ", but ", ". Then ")
    text = _clause(rng, False)
    for _ in range(int(rng.integers(0, 4))):
        text += joins[int(rng.integers(len(joins)))] + _clause(rng, False)
    return text[0].upper() + text[1:] + "."


# --------------------------------------------------------------------------- document pages
LAYOUT_CLASSES = ("text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer")


def _paragraph(d: ImageDraw.ImageDraw, rng: np.random.Generator, x: int, y: int, w: int, f, ink: int,
               lines: int) -> int:
    """Justified-looking lines of random words from (x, y) in a column ``w`` wide; returns the bottom."""
    lh = sum(f.getmetrics()) + 2
    for k in range(lines):
        text = ""
        while True:
            word = random_text(rng, max_words=1)
            if f.getlength(text + " " + word) > w:
                break
            text = (text + " " + word).strip()
        if k == lines - 1:  # short last line
            text = text[: max(1, int(len(text) * rng.uniform(0.3, 0.9)))]
        d.text((x, y), text, fill=ink, font=f)
        y += lh
    return y


def document_page(rng: np.random.Generator, size: tuple[int, int] = (608, 800)):
    """A rendered document page: header, title, columns of paragraphs, a table and a figure with their
    captions, a footer. Returns (BGR image, [(x0, y0, x1, y1), class name] regions as drawn)."""
    W, H = size
    paper = int(rng.integers(215, 256))
    ink = int(rng.integers(0, 70))
    im = Image.new("L", (W, H), paper)
    d = ImageDraw.Draw(im)
    regions = []
    face = lambda bold=False: str(rng.choice([f for f in FONT_FILES if ("Bold" in f) == bold]))
    body = font(face(), int(rng.integers(9, 14)))
    margin = int(rng.integers(24, 56))
    y = int(rng.integers(12, 24))
    hf = font(face(), int(rng.integers(8, 11)))
    d.text((margin, y), random_text(rng, 4), fill=ink, font=hf)
    regions.append(((margin, y, margin + int(hf.getlength(random_text(rng, 1))) + 80, y + sum(hf.getmetrics())),
                    "header"))
    y += 30
    tf = font(face(True), int(rng.integers(18, 30)))
    title = random_text(rng, 4)
    tx = margin if rng.random() < 0.5 else max(margin, (W - int(tf.getlength(title))) // 2)
    d.text((tx, y), title, fill=ink, font=tf)
    regions.append(((tx, y, tx + int(tf.getlength(title)), y + sum(tf.getmetrics())), "title"))
    y += sum(tf.getmetrics()) + 16
    cols = int(rng.integers(1, 3))
    gap = 20
    cw = (W - 2 * margin - (cols - 1) * gap) // cols
    for c in range(cols):
        x, yy = margin + c * (cw + gap), y
        while yy < H - 120:
            block = rng.random()
            if block < 0.6:
                y1 = _paragraph(d, rng, x, yy, cw, body, ink, int(rng.integers(3, 9)))
                regions.append(((x, yy, x + cw, y1), "text"))
            elif block < 0.8:  # table: a grid with numbers
                rows, ncol = int(rng.integers(3, 7)), int(rng.integers(2, 5))
                rh = sum(body.getmetrics()) + 6
                y1 = yy + rows * rh
                if y1 > H - 100:
                    break
                for r in range(rows + 1):
                    d.line((x, yy + r * rh, x + cw, yy + r * rh), fill=ink, width=1)
                for k in range(ncol + 1):
                    d.line((x + k * cw // ncol, yy, x + k * cw // ncol, y1), fill=ink, width=1)
                for r in range(rows):
                    for k in range(ncol):
                        d.text((x + k * cw // ncol + 4, yy + r * rh + 3), str(int(rng.integers(0, 10 ** 4))),
                               fill=ink, font=body)
                regions.append(((x, yy, x + cw, y1), "table"))
                cap = font(face(True), body.size)
                d.text((x, y1 + 4), "Table " + random_text(rng, 3), fill=ink, font=cap)
                regions.append(((x, y1 + 4, x + min(cw, int(cap.getlength("Table x")) + 120),
                                 y1 + 4 + sum(cap.getmetrics())), "table_caption"))
                y1 += 8 + sum(cap.getmetrics())
            else:  # figure: a simple chart
                fh = int(rng.integers(80, 200))
                if yy + fh > H - 100:
                    break
                d.rectangle((x, yy, x + cw, yy + fh), outline=ink)
                pts = np.cumsum(rng.normal(0, fh / 12, 12)) + fh / 2
                xs = np.linspace(x + 8, x + cw - 8, 12)
                d.line([(float(a), float(np.clip(yy + b, yy + 4, yy + fh - 4))) for a, b in zip(xs, pts)],
                       fill=int(rng.integers(0, 120)), width=2)
                for k in range(int(rng.integers(2, 8))):
                    bx = x + 10 + k * (cw - 20) // 8
                    bh = int(rng.integers(10, fh - 10))
                    d.rectangle((bx, yy + fh - bh, bx + (cw - 20) // 12, yy + fh - 2), fill=int(rng.integers(60, 200)))
                regions.append(((x, yy, x + cw, yy + fh), "figure"))
                cap = font(face(), body.size)
                d.text((x, yy + fh + 4), "Figure " + random_text(rng, 3), fill=ink, font=cap)
                regions.append(((x, yy + fh + 4, x + min(cw, 200), yy + fh + 4 + sum(cap.getmetrics())),
                                "figure_caption"))
                y1 = yy + fh + 8 + sum(cap.getmetrics())
            yy = y1 + int(rng.integers(8, 20))
    d.text((W // 2 - 10, H - 24), str(int(rng.integers(1, 300))), fill=ink, font=hf)
    regions.append(((W // 2 - 10, H - 24, W // 2 + 20, H - 24 + sum(hf.getmetrics())), "footer"))
    bgr = cv2.cvtColor(np.asarray(im), cv2.COLOR_GRAY2BGR)
    return degrade(bgr, rng), regions


# --------------------------------------------------------------------------- held-out text lines
# Text unlike the recognizer's calibration lines (``text_line``: random letter strings in DejaVu faces,
# 20-43 px, dark on light grey): English words and sentence pieces, prices, dates and codes; the
# STIX (Times-like) and Computer Modern faces that ship inside matplotlib; small (12-19 px, upscaled by
# the recognizer) or large (46-72 px) glyphs; coloured ink on coloured paper, or light text on dark.
HELDOUT_FONTS = ("STIXGeneral.ttf", "STIXGeneralBol.ttf", "STIXGeneralItalic.ttf", "STIXGeneralBolIta.ttf",
                 "cmr10.ttf", "cmss10.ttf", "cmtt10.ttf", "cmb10.ttf")
_HELDOUT_WORDS = tuple(w for group in (_NOUNS, _ADJS, tuple(v for pair in _VERBS for v in pair), _NAMES)
                       for w in group) + ("invoice", "total", "amount", "street", "phone", "order", "page", "date")


@cache
def matplotlib_font(name: str, size: int):
    from PIL import ImageFont

    spec = importlib.util.find_spec("matplotlib")
    return ImageFont.truetype(str(Path(spec.submodule_search_locations[0]) / "mpl-data/fonts/ttf" / name), size)


def heldout_text(rng: np.random.Generator) -> str:
    kind = rng.random()
    pick = lambda: _HELDOUT_WORDS[int(rng.integers(len(_HELDOUT_WORDS)))]
    if kind < 0.5:  # words, sentence case or title case
        words = [pick() for _ in range(int(rng.integers(1, 5)))]
        text = " ".join(w.capitalize() if rng.random() < 0.3 else w for w in words)
        return text[0].upper() + text[1:] + ("." if rng.random() < 0.3 else "")
    if kind < 0.7:  # price
        return f"{pick().capitalize()} ${int(rng.integers(1, 9999))}.{int(rng.integers(0, 100)):02d}"
    if kind < 0.85:  # date and time
        return (f"{int(rng.integers(1990, 2031))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d} "
                f"{int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d}")
    return f"{pick().upper()[:4]}-{int(rng.integers(100, 99999))}"  # reference code


def heldout_text_line(rng: np.random.Generator, max_aspect: float | None = None) -> tuple[np.ndarray, str]:
    """One held-out text line crop (BGR) and its text; trailing characters are dropped until
    width/height <= ``max_aspect``, as in ``text_line``."""
    text = heldout_text(rng)
    size = int(rng.integers(12, 20)) if rng.random() < 0.5 else int(rng.integers(46, 73))
    f = matplotlib_font(HELDOUT_FONTS[int(rng.integers(len(HELDOUT_FONTS)))], size)
    paper = rng.integers(0, 256, 3)
    ink = rng.integers(0, 256, 3)
    while np.abs(paper.astype(int).mean() - ink.astype(int).mean()) < 90:  # keep it legible
        ink = rng.integers(0, 256, 3)
    while True:
        x0, y0, x1, y1 = f.getbbox(text)
        mx, my = int(rng.integers(2, 10)), int(rng.integers(2, max(3, (y1 - y0) // 3)))
        W, H = x1 - x0 + 2 * mx, y1 - y0 + 2 * my
        if max_aspect is None or W / H <= max_aspect or len(text) <= 1:
            break
        text = text[:-1].rstrip()
    im = Image.new("RGB", (W, H), tuple(int(v) for v in paper))
    ImageDraw.Draw(im).text((mx - x0, my - y0), text, fill=tuple(int(v) for v in ink), font=f)
    bgr = np.ascontiguousarray(np.asarray(im)[:, :, ::-1])
    return degrade(bgr, rng), text


# --------------------------------------------------------------------------- captchas (ddddocr)
CAPTCHA_CHARS = "abcdefghijkmnpqrstuvwxyz23456789"  # the usual captcha alphabet: no 0/o, 1/l


def captcha(rng: np.random.Generator, heldout: bool = False) -> tuple[Image.Image, str]:
    """A 64-px-high captcha (RGB) of 4-6 lowercase letters and digits and its text. Calibration kind:
    DejaVu glyphs tilted by up to 8 degrees on a light background. ``heldout``: matplotlib's STIX
    fonts tilted by up to 25 degrees, 2-4 stray lines across and pixel noise, as real captchas."""
    from qnnx.examples.text_lines import FONT_FILES, font

    text = "".join(CAPTCHA_CHARS[int(i)] for i in rng.integers(len(CAPTCHA_CHARS), size=int(rng.integers(4, 7))))
    W, H = 40 * len(text) + 20, 64
    img = Image.new("RGB", (W, H), tuple(int(v) for v in rng.integers(200, 256, 3)))
    x, tilt = 10, 25.0 if heldout else 8.0
    for ch in text:
        size = int(rng.integers(32, 46))
        f = (matplotlib_font(HELDOUT_FONTS[int(rng.integers(len(HELDOUT_FONTS)))], size) if heldout
             else font(FONT_FILES[int(rng.integers(len(FONT_FILES)))], size))
        glyph = Image.new("L", (2 * size, 2 * size), 0)
        ImageDraw.Draw(glyph).text((size // 2, size // 4), ch, font=f, fill=255)
        glyph = glyph.rotate(float(rng.uniform(-tilt, tilt)), resample=Image.BILINEAR)
        ink = Image.new("RGB", glyph.size, tuple(int(v) for v in rng.integers(0, 120, 3)))
        img.paste(ink, (x - size // 2, int(rng.integers(-12, 4))), glyph)
        x += int(size * rng.uniform(0.55, 0.8))
    if heldout:
        d = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(2, 5))):
            ends = [(int(rng.integers(0, W)), int(rng.integers(0, H))) for _ in range(2)]
            d.line(ends, fill=tuple(int(v) for v in rng.integers(0, 200, 3)), width=int(rng.integers(1, 3)))
        noisy = np.asarray(img).astype(np.int16) + rng.integers(-30, 31, (H, W, 3))
        img = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
    return img.crop((0, 0, min(W, x + 10), H)), text
