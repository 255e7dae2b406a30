"""Seeded synthetic audio for the voice-activity benchmark: speech-like sounds, noises and silence.

No recordings ship in an installed package, so "speech" is made by source-filter synthesis, the way
vowels are produced: a glottal pulse train (pitch 80-260 Hz with drift and jitter) through three
formant resonators whose frequencies move from syllable to syllable, with a 3-7 Hz syllable envelope
and short noise bursts for fricatives. Non-speech is silence, white/pink/brown noise, hum, steady
tones and clicks. Every clip is 16 kHz float32 in [-1, 1]; ``truth`` marks the 512-sample frames
(Silero VAD's frame at 16 kHz) whose centre lies inside a speech segment.
"""

from __future__ import annotations

import numpy as np

SR = 16000
FRAME = 512

# Vowel formants (F1, F2, F3) in Hz, roughly an adult speaker's /a e i o u/ and two schwa-like ones.
_VOWELS = ((730, 1090, 2440), (530, 1840, 2480), (270, 2290, 3010), (570, 840, 2410), (300, 870, 2240),
           (500, 1500, 2500), (640, 1190, 2390))


def _resonator(x: np.ndarray, freq: np.ndarray, bw: float, block: int = 160) -> np.ndarray:
    """Two-pole resonator whose centre frequency follows ``freq`` (per sample), updated every
    ``block`` samples (10 ms) with the filter state carried across."""
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bw / SR)
    y, zi = np.empty_like(x), np.zeros(2)
    for s in range(0, x.size, block):
        a = [1.0, -2 * r * np.cos(2 * np.pi * freq[s] / SR), r * r]
        y[s:s + block], zi = lfilter([1 - r], a, x[s:s + block], zi=zi)
    return y


def _speech(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` samples of voiced syllables with fricative bursts (not normalised)."""
    t = np.arange(n) / SR
    f0 = float(rng.uniform(80, 260)) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(0.3, 1.5) * t
                                                          + rng.uniform(0, 6.3)))
    f0 *= 1 + 0.01 * rng.standard_normal(n)  # jitter
    phase = np.cumsum(f0 / SR)
    pulses = np.diff(np.floor(phase), prepend=0.0) * 1.0
    source = np.convolve(pulses, np.hanning(int(rng.integers(12, 40))), mode="same")
    source += 0.02 * rng.standard_normal(n)  # breath
    # syllables: each gets a vowel; formants glide linearly between neighbours
    rate = float(rng.uniform(3, 7))
    n_syl = max(2, int(np.ceil(n / SR * rate)) + 1)
    vowels = np.array([_VOWELS[int(rng.integers(len(_VOWELS)))] for _ in range(n_syl)], np.float64)
    vowels *= rng.uniform(0.9, 1.15)  # speaker
    knots = np.linspace(0, n, n_syl)
    out = np.zeros(n)
    for k, bw in zip(range(3), (80.0, 110.0, 160.0)):
        out += _resonator(source, np.interp(np.arange(n), knots, vowels[:, k]), bw) * (1.0, 0.6, 0.3)[k]
    env = 0.55 + 0.45 * np.sin(2 * np.pi * rate * t + rng.uniform(0, 6.3))
    out *= env ** 2
    for _ in range(int(n / SR * rate / 2)):  # fricatives between syllables
        start, length = int(rng.integers(0, max(1, n - 2000))), int(rng.integers(600, 2000))
        burst = np.diff(rng.standard_normal(length + 1)) * np.hanning(length) * rng.uniform(0.05, 0.3)
        out[start:start + length] += burst * np.abs(out).max()
    return out


def _noise(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = int(rng.integers(6))
    white = rng.standard_normal(n)
    if kind == 0:
        return np.zeros(n)
    if kind == 1:
        return white
    if kind == 2:  # pink-ish: 1/f by summing octave-smoothed white noise
        return sum(np.convolve(white, np.ones(2 ** k) / 2 ** k, "same") for k in range(0, 9, 2))
    if kind == 3:  # brown
        b = np.cumsum(white)
        return b - np.convolve(b, np.ones(801) / 801, "same")
    t = np.arange(n) / SR
    if kind == 4:  # mains hum with harmonics, or a steady tone
        f = float(rng.choice([50.0, 60.0, rng.uniform(300, 3000)]))
        return sum(np.sin(2 * np.pi * f * h * t) / h for h in (1, 2, 3))
    clicks = np.zeros(n)  # kind 5: sparse clicks
    clicks[rng.integers(0, n, int(rng.integers(3, 15)))] = 1.0
    return np.convolve(clicks, np.exp(-np.arange(200) / 30.0), "same") + 0.01 * white


def clip(rng: np.random.Generator, seconds: float = 2.048) -> tuple[np.ndarray, np.ndarray]:
    """(audio float32, per-frame speech truth bool). About two clips in three hold 1-2 speech segments
    over background noise at 0-30 dB SNR; the rest are background only, sometimes loud."""
    n = int(seconds * SR) // FRAME * FRAME
    background = _noise(rng, n)
    background /= np.abs(background).max() + 1e-9
    speech_mask = np.zeros(n, bool)
    speech = np.zeros(n)
    if rng.random() < 0.65:
        for _ in range(int(rng.integers(1, 3))):
            length = int(rng.uniform(0.3, 1.2) * SR)
            start = int(rng.integers(0, max(1, n - length)))
            s = _speech(rng, length)
            speech[start:start + length] += s / (np.abs(s).max() + 1e-9)
            speech_mask[start:start + length] = True
    level = float(rng.uniform(0.05, 0.8))
    snr_db = float(rng.uniform(0, 30))
    bg_level = level * 10 ** (-snr_db / 20) if speech_mask.any() else float(rng.uniform(0.0, 0.5))
    audio = level * speech + bg_level * background
    audio = np.clip(audio, -1, 1).astype(np.float32)
    centres = np.arange(n // FRAME) * FRAME + FRAME // 2
    return audio, speech_mask[centres]
