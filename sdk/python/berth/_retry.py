"""The retry arithmetic of SDK-1, mirrored from the Go SDK (client/retry.go, backoff.go).

Every duration here is whole nanoseconds (an ``int``) so the windows, the jitter and the
saturation are exactly the Go SDK's; the client converts to seconds only to sleep and to
report.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Mapping, Optional, Tuple

#: Nanoseconds per second.
NS = 1_000_000_000

#: Full-jitter defaults (SDK-1): base 0.25 s, cap 8 s, in nanoseconds.
BACKOFF_BASE_NS = 250_000_000
BACKOFF_CAP_NS = 8 * NS

#: Where a Retry-After saturates: the longest Go time.Duration (about 292 years). Any all-digit
#: value converts to at most this, and so ends past every deadline a caller can set (C30).
MAX_RETRY_AFTER_NS = 2**63 - 1

_MAX_SECS = MAX_RETRY_AFTER_NS // NS


def backoff_ns(attempt: int, base_ns: int = BACKOFF_BASE_NS, cap_ns: int = BACKOFF_CAP_NS) -> int:
    """Return the full-jitter window min(cap, base·2^attempt) of SDK-1, in nanoseconds.

    The caller sleeps uniform [0, window). ``attempt`` counts from 0 (the wait after the first
    failure); a negative one counts as 0. The window is always in (0, cap] for any attempt
    (64, 10,000: C04). A non-positive base or cap takes its default (0.25 s, 8 s); a base above
    the cap is lowered to the cap. Same as berth.Backoff in Go.
    """
    if cap_ns <= 0:
        cap_ns = BACKOFF_CAP_NS
    if base_ns <= 0:
        base_ns = BACKOFF_BASE_NS
    if base_ns > cap_ns:
        base_ns = cap_ns
    if attempt < 0:
        attempt = 0
    if attempt >= 63 or base_ns > (cap_ns >> attempt):
        return cap_ns
    return base_ns << attempt


def jitter_ns(window_ns: int, r: float) -> int:
    """Return a full-jitter sleep r·window in nanoseconds, r from a uniform [0, 1) source.

    r is clamped into [0, 1), so a faulty source (NaN, negative, 1 or more) can never stretch
    the sleep past the window: not above 0 (or NaN) gives 0, 1 or more gives window − 1 ns.
    """
    if not (r > 0):  # also NaN
        return 0
    if r >= 1:
        return window_ns - 1
    d = int(r * window_ns)
    if d >= window_ns:  # r just below 1 can round up
        d = window_ns - 1
    return d


def _parse_seconds(digits: str) -> int:
    """Convert a run of ASCII digits to nanoseconds, saturating at MAX_RETRY_AFTER_NS."""
    secs = 0
    for ch in digits:
        secs = secs * 10 + (ord(ch) - 48)
        if secs > _MAX_SECS:
            return MAX_RETRY_AFTER_NS
    return secs * NS


def seconds_ns(n: float) -> int:
    """Convert a count of whole seconds from an error body (retry_after_s) to nanoseconds,
    0 for non-positive, saturating like a header."""
    if not (n > 0):
        return 0
    if n > _MAX_SECS:
        return MAX_RETRY_AFTER_NS
    return int(n) * NS


def _is_digits(s: str) -> bool:
    return s != "" and all("0" <= c <= "9" for c in s)


_MONTHS = {m: i + 1 for i, m in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"])}
_DAYS_SHORT = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
_DAYS_LONG = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}


def _hms(s: str) -> Optional[Tuple[int, int, int]]:
    parts = s.split(":")
    if len(parts) != 3 or not all(len(p) == 2 and _is_digits(p) for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def parse_http_date(v: str) -> Optional[float]:
    """Parse an HTTP-date in the three forms Go's http.ParseTime accepts (RFC 9110 §5.6.7):
    IMF-fixdate ``Sun, 06 Nov 1994 08:49:37 GMT``, RFC 850 ``Sunday, 06-Nov-94 08:49:37 GMT``
    and asctime ``Sun Nov  6 08:49:37 1994``. Returns seconds since the epoch (UTC), or None
    when v is none of them or names no real date (day 32, hour 25…). Locale-independent."""
    f = v.split()
    try:
        if len(f) == 6 and f[0].endswith(",") and f[0][:-1] in _DAYS_SHORT and f[5] == "GMT":
            # IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
            if len(f[1]) != 2 or not _is_digits(f[1]) or f[2] not in _MONTHS or len(f[3]) != 4 or not _is_digits(f[3]):
                return None
            day, month, year, t = int(f[1]), _MONTHS[f[2]], int(f[3]), _hms(f[4])
        elif len(f) == 4 and f[0].endswith(",") and f[0][:-1] in _DAYS_LONG and f[3] == "GMT":
            # RFC 850: Sunday, 06-Nov-94 08:49:37 GMT (two-digit year: 69–99 → 19xx, else 20xx)
            d = f[1].split("-")
            if len(d) != 3 or len(d[0]) != 2 or not _is_digits(d[0]) or d[1] not in _MONTHS or len(d[2]) != 2 or not _is_digits(d[2]):
                return None
            yy = int(d[2])
            day, month, year, t = int(d[0]), _MONTHS[d[1]], (1900 + yy if yy >= 69 else 2000 + yy), _hms(f[2])
        elif len(f) == 5 and f[0] in _DAYS_SHORT and f[1] in _MONTHS:
            # asctime: Sun Nov  6 08:49:37 1994
            if not (1 <= len(f[2]) <= 2) or not _is_digits(f[2]) or len(f[4]) != 4 or not _is_digits(f[4]):
                return None
            day, month, year, t = int(f[2]), _MONTHS[f[1]], int(f[4]), _hms(f[3])
        else:
            return None
        if t is None:
            return None
        when = _dt.datetime(year, month, day, t[0], t[1], t[2], tzinfo=_dt.timezone.utc)
    except ValueError:  # day 32, hour 25, …
        return None
    return when.timestamp()


def parse_retry_after(v: str, now: float) -> Tuple[int, bool]:
    """Read a Retry-After value (RFC 9110 §10.2.3) against ``now`` (seconds since the epoch),
    SDK-1, exactly as the Go SDK's ParseRetryAfter. Returns (wait in nanoseconds, present):

    - delta-seconds, one or more ASCII digits: that many seconds whatever its size ("86401",
      "20251231" and twenty nines are long waits, not garbage), saturating at about 292 years.
      The retry loop gives up at once when the wait ends past its deadline (C30).
    - an HTTP-date: the time until that instant. A date at or before now gives (0, True):
      retry at once (C01) — the loop never does that twice in a row.
    - anything else — negative, signed, fractional, empty, garbage, or a date that does not
      parse — gives (0, False): treated as absent, full jitter (C02).
    """
    v = v.strip(" \t\r\n")
    if v == "":
        return 0, False
    if _is_digits(v):
        return _parse_seconds(v), True
    t = parse_http_date(v)
    if t is None:
        return 0, False
    d = t - now
    if not (d > 0):
        return 0, True
    ns = d * NS
    if ns >= MAX_RETRY_AFTER_NS or math.isinf(ns):
        return MAX_RETRY_AFTER_NS, True
    return int(ns), True


def retry_after_header(headers: Mapping[str, str], local_now: float) -> Tuple[int, bool]:
    """Read an answer's Retry-After header. An HTTP-date is read against the answer's own Date
    header when it has a valid one, so the wait is the server's "date minus now" whatever the
    skew between the two clocks; otherwise against ``local_now``."""
    v = _get(headers, "Retry-After")
    if not v:
        return 0, False
    now = local_now
    server_date = parse_http_date(_get(headers, "Date") or "")
    if server_date is not None:
        now = server_date
    return parse_retry_after(v, now)


def _get(headers: Mapping[str, str], name: str) -> Optional[str]:
    """Case-insensitive header lookup on a plain mapping or an http.client.HTTPMessage."""
    get = getattr(headers, "get", None)
    if get is not None:
        v = get(name)
        if v is not None:
            return v
    low = name.lower()
    for k in headers:
        if k.lower() == low:
            return headers[k]
    return None
