"""numba kernels that parse the body of an ASCII grid: whitespace-separated numbers, one grid row per line.

Lines are located first (a vectorised search for newlines), then parsed in parallel, each line into
its own output row. Numbers are converted exactly: a decimal mantissa of at most 19 digits times an
exact power of ten (|exponent| <= 22) is one correctly rounded IEEE operation. Tokens outside that
fast path (very long mantissas, huge exponents) are flagged and the caller converts their line with
Python's ``float`` -- the same correctly rounded result, only slower.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .jit import serial_twin

# status codes per line
OK = 0
WRONG_COUNT = 1  # detail = number of values found
BAD_TOKEN = 2  # detail = byte offset of the bad token inside the buffer
SLOW_TOKEN = 3  # valid number that needs the exact slow path
OVERFLOW = 4  # finite number beyond the output dtype's range (detail = byte offset)

_POW10 = np.array([10.0**i for i in range(23)], dtype=np.float64)
_NAN = np.nan
_INF = np.inf


@nb.njit(cache=True, nogil=True, inline="always")
def _is_space(c):
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12


@nb.njit(cache=True, nogil=True)
def _lower(c):
    return c + 32 if 65 <= c <= 90 else c


_INFINITY = np.frombuffer(b"infinity", dtype=np.uint8)
_NAN_WORD = np.frombuffer(b"nan", dtype=np.uint8)


@nb.njit(cache=True, nogil=True)
def _matches(buf, i, n, word):
    """buf[i:i+n] equals the first n letters of ``word``, ignoring case."""
    for k in range(n):
        if _lower(buf[i + k]) != word[k]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _parse_token(buf, i, end, pow10):
    """Parse one token starting at buf[i] (not whitespace). Returns (value, next_index, status)."""
    start = i
    neg = False
    c = buf[i]
    if c == 43 or c == 45:  # + -
        neg = c == 45
        i += 1
    after_sign = i
    mant = np.uint64(0)
    ndig = 0  # significant digits kept in mant
    dropped = False  # digits beyond 19 (needs the slow path)
    exp10 = 0
    seen_digit = False
    point = False  # past the decimal point: kept digits scale by 1/10, dropped ones do not
    while i < end:
        c = buf[i]
        if c == 46 and not point:  # .
            point = True
        elif 48 <= c <= 57:
            seen_digit = True
            if ndig < 19:
                if mant != 0 or c != 48:
                    mant = mant * np.uint64(10) + np.uint64(c - 48)
                    ndig += 1
                if point:
                    exp10 -= 1
            else:
                dropped = True
                if not point:
                    exp10 += 1
        else:
            break
        i += 1
    if not seen_digit:
        # special tokens: nan, inf, infinity, '*' (GRASS null) -- case-insensitive
        j = i
        n = 0
        while j < end and not _is_space(buf[j]) and buf[j] != 10:
            j += 1
            n += 1
        if n == 1 and buf[i] == 42 and i == start:  # '*'
            return _NAN, j, OK
        if i != after_sign:  # a '.' alone before a word (".nan") is no number
            return 0.0, j, BAD_TOKEN
        if n == 3 and _matches(buf, i, n, _NAN_WORD):  # n, not a literal 3: one build of _matches
            return _NAN, j, OK
        if (n == 3 or n == 8) and _matches(buf, i, n, _INFINITY):
            return (-_INF if neg else _INF), j, OK
        return 0.0, j, BAD_TOKEN
    if i < end and (buf[i] == 101 or buf[i] == 69):  # e E
        i += 1
        eneg = False
        if i < end and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        if i >= end or not (48 <= buf[i] <= 57):
            return 0.0, i, BAD_TOKEN
        e = 0
        while i < end and 48 <= buf[i] <= 57:
            if e < 100000:
                e = e * 10 + (buf[i] - 48)
            i += 1
        exp10 += -e if eneg else e
    if i < end and not _is_space(buf[i]) and buf[i] != 10:
        return 0.0, i, BAD_TOKEN
    if mant == 0:
        return (-0.0 if neg else 0.0), i, OK
    if dropped or mant >= np.uint64(1 << 53) or exp10 > 22 or exp10 < -22:
        return 0.0, i, SLOW_TOKEN
    v = float(mant)
    if exp10 >= 0:
        v = v * pow10[exp10]
    else:
        v = v / pow10[-exp10]
    return (-v if neg else v), i, OK


@nb.njit(cache=True, nogil=True)
def _parse_line(buf, start, end, out_row, pow10, nodata):
    """Parse buf[start:end] into out_row; values equal to ``nodata[0]`` (if given) become NaN.
    Returns (status, detail)."""
    ncols = out_row.shape[0]
    i = start
    k = 0
    slow = False
    while True:
        while i < end and _is_space(buf[i]):
            i += 1
        if i >= end:
            break
        v, i2, st = _parse_token(buf, i, end, pow10)
        if st == BAD_TOKEN:
            return BAD_TOKEN, i
        if st == SLOW_TOKEN:
            slow = True
        if k < ncols:
            out_row[k] = v  # float64 -> output dtype: one more IEEE rounding, as numpy's astype
            if np.isinf(out_row[k]) and not np.isinf(v):
                return OVERFLOW, i
            if nodata.shape[0] and out_row[k] == nodata[0]:  # compared in the output's precision
                out_row[k] = np.nan
        k += 1
        i = i2
    if k != ncols:
        return WRONG_COUNT, k
    if slow:
        return SLOW_TOKEN, 0
    return OK, 0


@nb.njit(cache=True, nogil=True, parallel=True)
def parse_lines(buf, starts, ends, out, status, detail, nodata):
    """Parse line i = buf[starts[i]:ends[i]] into out[i, :] for every i (in parallel).

    ``out`` may be float64 or float32 (numba compiles one version for each); ``nodata`` is an
    array of out's dtype holding the nodata value (stored as NaN), or empty."""
    pow10 = _POW10
    for i in nb.prange(starts.shape[0]):
        st, d = _parse_line(buf, starts[i], ends[i], out[i], pow10, nodata)
        status[i] = st
        detail[i] = d


# Small grids (fewer than SERIAL_BELOW cells) are parsed by the same loop without threads.
parse_lines_serial = serial_twin(parse_lines)


@nb.njit(cache=True, nogil=True)
def blank_line(buf, start, end):
    for i in range(start, end):
        if not _is_space(buf[i]):
            return False
    return True
