"""Read a PNG's pixels with the standard library (zlib + the five scanline filters): enough to
check what a headless browser drew, without an imaging package."""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from pathlib import Path


def read_png(path: str | Path) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, rows of raw pixel bytes) of an 8-bit RGB or RGBA PNG."""
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    at, idat = 8, []
    width = height = bpp = 0
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"{path}: only 8-bit RGB/RGBA, non-interlaced PNGs (got depth {depth}, "
                                 f"colour type {color}, interlace {interlace})")
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        at += 12 + length
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, previous))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 255
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = previous[i]
                c = previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        elif kind != 0:
            raise ValueError(f"{path}: bad filter {kind} on row {y}")
        rows.append(bytes(line))
        previous = line
    return width, height, bpp, rows


def colour_counts(path: str | Path) -> Counter:
    """How many pixels have each '#rrggbb' colour (alpha ignored)."""
    width, _, bpp, rows = read_png(path)
    counts: Counter = Counter()
    for row in rows:
        counts.update(row[i:i + 3] for i in range(0, width * bpp, bpp))
    return Counter({"#" + key.hex(): n for key, n in counts.items()})


def write_png(path: str | Path, width: int, bpp: int, rows: list[bytes]) -> None:
    """Rows of raw pixels (8-bit RGB or RGBA) as a PNG, every row unfiltered."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, len(rows), 8, 2 if bpp == 3 else 6, 0, 0, 0)
    data = zlib.compress(b"".join(b"\x00" + row for row in rows), 9)
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def first_row_with(path: str | Path, colour: str) -> int | None:
    """The first row holding a pixel of this '#rrggbb' colour."""
    width, _, bpp, rows = read_png(path)
    want = bytes.fromhex(colour.lstrip("#"))
    for y, row in enumerate(rows):
        if any(row[i:i + 3] == want for i in range(0, width * bpp, bpp)):
            return y
    return None


def crop_rows(path: str | Path, out: str | Path, top: int, height: int) -> None:
    width, _, bpp, rows = read_png(path)
    write_png(out, width, bpp, rows[max(0, top):max(0, top) + height])
