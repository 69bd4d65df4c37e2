"""A JPEG's frame header read without decoding anything: its size, channels and coding.

Pure (bytes in, numbers out). The decoders ask it first: opening an image with Pillow
to learn its size costs a worker about an eighth of its time at ImageNet's sizes (a
file object, a parser, a lock around the pixel-bomb warning), walking the markers up to
the frame header a few microseconds. Anything this walk does not recognise (bytes
between segments, a scan before the frame header, a header cut short, a height left to
a DNL marker) is ``None``, and the caller goes to Pillow, which names the fault.
"""

from __future__ import annotations

from typing import NamedTuple

#: Start-of-frame markers (0xC4 defines Huffman tables, 0xC8 is reserved, 0xCC defines
#: arithmetic conditioning: not frames).
SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7,
                         0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})  # fmt: skip
#: Huffman-coded, DCT-based frames: baseline, extended sequential and progressive, what
#: libjpeg-turbo (OpenCV's, DALI's) decodes at a reduced size.
HUFFMAN_DCT = frozenset({0xC0, 0xC1, 0xC2})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7: no length follows
_ENDS = frozenset({0xD8, 0xD9, 0xDA})  # SOI again, EOI, SOS: no frame header before


class JpegHeader(NamedTuple):
    """What a JPEG's frame header says."""

    width: int
    height: int
    components: int  # 1 gray, 3 YCbCr (or RGB), 4 CMYK / YCCK
    precision: int  # bits a sample: 8, or 12 / 16
    marker: int  # the start-of-frame marker (0xC0 baseline, 0xC2 progressive, ...)

    @property
    def plain(self) -> bool:
        """An 8-bit gray or colour Huffman-coded DCT JPEG: what decodes straight to 8-bit
        RGB (no CMYK, no 12-bit samples, no lossless or arithmetic coding)."""
        return self.precision == 8 and self.components in (1, 3) and self.marker in HUFFMAN_DCT


def header(data: bytes | bytearray | memoryview) -> JpegHeader | None:
    """``data``'s frame header, or None where ``data`` is not a JPEG whose markers lead
    cleanly to one (see the module's docstring)."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i = 2
    while i + 1 < n:
        if data[i] != 0xFF:
            return None  # bytes between segments (libjpeg warns and skips; Pillow names them)
        m = data[i + 1]
        if m == 0xFF:  # a fill byte before the marker
            i += 1
            continue
        if m in _STANDALONE:
            i += 2
            continue
        if m == 0x00 or m in _ENDS or i + 4 > n:
            return None
        length = data[i + 2] << 8 | data[i + 3]
        if length < 2:
            return None
        if m in SOF_MARKERS:
            if length < 8 or i + 10 > n:
                return None
            height = data[i + 5] << 8 | data[i + 6]
            width = data[i + 7] << 8 | data[i + 8]
            components = data[i + 9]
            if not (width and height and components):
                return None  # (a height of 0 is given later, by a DNL marker)
            return JpegHeader(width, height, components, data[i + 4], m)
        i += 2 + length
    return None
