"""The legend band under every PNG picture (``terrain export ... -o X.png``): a title with the unit,
then a colour ramp with its values at both ends and the middle, or swatches for ids and masks.

Drawn with numpy alone: text in a 5 x 8 bitmap font (lower case, digits and the symbols numbers and
units need; upper case is drawn as lower case), scaled by whole pixels. No font files, no PIL.
"""
from __future__ import annotations

import numpy as np

# 5 x 8 glyphs: 8 rows of 5 bits (most significant = leftmost column), as hex bytes; row 7 holds descenders
_GLYPHS = {
    "0": "0e11131519110e00", "1": "040c040404040e00", "2": "0e11010204081f00", "3": "1f02040201110e00",
    "4": "02060a121f020200", "5": "1f101e0101110e00", "6": "0608101e11110e00", "7": "1f01020408080800",
    "8": "0e11110e11110e00", "9": "0e11110f01020c00", "a": "00000e010f110f00", "b": "1010161911111e00",
    "c": "00000e1010110e00", "d": "01010d1311110f00", "e": "00000e111f100e00", "f": "0609081c08080800",
    "g": "00000f11110f010e", "h": "1010161911111100", "i": "04000c0404040e00", "j": "020006020202120c",
    "k": "1010121418141200", "l": "0c04040404040e00", "m": "00001a1515151500", "n": "0000161911111100",
    "o": "00000e1111110e00", "p": "00001e11111e1010", "q": "00000f11110f0101", "r": "0000161910101000",
    "s": "00000f100e011e00", "t": "08081c0808090600", "u": "0000111111130d00", "v": "00001111110a0400",
    "w": "0000111115150a00", "x": "0000110a040a1100", "y": "00001111110f010e", "z": "00001f0204081f00",
    ".": "00000000000c0c00", ",": "00000000000c0408", "-": "0000001f00000000", "+": "0004041f04040000",
    "^": "040a110000000000", "(": "0204080808040200", ")": "0804020202040800", "/": "0001020408100000",
    ":": "000c0c000c0c0000", "=": "00001f001f000000", "%": "1819020408130300", "<": "0204081008040200",
    ">": "0804020102040800", "_": "000000000000001f",
    ";": "000c0c000c040800", "\u2264": "0204080402001f00", "\u2265": "0804020408001f00",
}
_BLANK = "0000000000000000"
INK = np.array([40.0, 40.0, 40.0])  # text colour
PAPER = np.array([255.0, 255.0, 255.0])  # the band's background


def text_mask(text: str, scale: int = 2) -> np.ndarray:
    """Boolean (8 * scale, 6 * scale * len(text)) image of ``text``: True where ink is."""
    rows = []
    for ch in text.lower():
        code = bytes.fromhex(_GLYPHS.get(ch, _BLANK))
        bits = np.unpackbits(np.frombuffer(code, np.uint8)[:, None], axis=1)[:, 3:]  # the low 5 bits
        rows.append(np.pad(bits, ((0, 0), (0, 1))))  # one column of space after each glyph
    glyphs = np.concatenate(rows, axis=1) if rows else np.zeros((8, 0), np.uint8)
    return np.kron(glyphs, np.ones((scale, scale), np.uint8)).astype(bool)


class Band:
    """A white band of ``width`` pixels on which lines of text, ramps and swatches are stacked."""

    def __init__(self, width: int, scale: int):
        self.width, self.scale = width, scale
        self.margin = 4 * scale
        self.rows: list[np.ndarray] = []  # (h, width, 3) float RGB pieces, top to bottom

    def _piece(self, height: int) -> np.ndarray:
        piece = np.empty((height, self.width, 3))
        piece[...] = PAPER
        self.rows.append(piece)
        return piece

    def text(self, text: str) -> None:
        mask = text_mask(text, self.scale)[:, : self.width - 2 * self.margin]
        piece = self._piece(mask.shape[0] + 2 * self.scale)
        piece[self.scale : self.scale + mask.shape[0], self.margin : self.margin + mask.shape[1]][mask] = INK

    def ramp(self, colours: np.ndarray, labels: list[str]) -> None:
        """``colours`` (n, 3) from the left end to the right; ``labels`` spread evenly under it."""
        s, m = self.scale, self.margin
        length = self.width - 2 * m
        bar = self._piece(7 * s)
        bar[s : 6 * s, m : m + length] = INK  # a thin frame around the colours
        at = np.linspace(0, len(colours) - 1, length - 2).round().astype(int)
        bar[s + 1 : 6 * s - 1, m + 1 : m + length - 1] = colours[at][None, :, :]
        masks = [text_mask(t, s) for t in labels]
        piece = self._piece(10 * s)
        for k, mask in enumerate(masks):  # the first under the left end, the last under the right
            centre = m + round(k * (length - 1) / max(len(masks) - 1, 1))
            left = min(max(centre - mask.shape[1] // 2, m), m + length - mask.shape[1])
            if left < 0:
                continue  # too narrow a band for this label
            piece[s : s + mask.shape[0], left : left + mask.shape[1]][mask] = INK

    def swatches(self, items: list[tuple[np.ndarray, str]]) -> None:
        """A row of colour squares, each followed by its label, as many as fit."""
        s, m = self.scale, self.margin
        piece = self._piece(10 * s)
        x = m
        for colour, label in items:
            mask = text_mask(label, s)
            if x + 8 * s + mask.shape[1] > self.width - m:
                break
            piece[s : 9 * s, x : x + 7 * s] = colour
            piece[s : 9 * s, x] = piece[s : 9 * s, x + 7 * s - 1] = INK
            piece[s, x : x + 7 * s] = piece[9 * s - 1, x : x + 7 * s] = INK
            piece[s : s + mask.shape[0], x + 9 * s : x + 9 * s + mask.shape[1]][mask] = INK
            x += 9 * s + mask.shape[1] + 4 * s

    def image(self) -> np.ndarray:
        """(h, width, 3) float RGB of the band, with a margin below."""
        self._piece(self.margin)
        return np.concatenate(self.rows, axis=0)


def band_for(picture_width: int, lines: list[str]) -> Band:
    """A band at least as wide as the picture and as the longest of ``lines`` (its scale: 2, or 3 for
    pictures over 1200 pixels wide)."""
    scale = 3 if picture_width > 1200 else 2
    need = max((6 * scale * len(t) for t in lines), default=0) + 8 * scale
    return Band(max(picture_width, need, 60 * scale), scale)
