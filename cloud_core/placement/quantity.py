"""Kubernetes resource quantities, read exactly as ``k8s.io/apimachinery``'s
``resource.ParseQuantity`` reads them, in bounded time and memory for any input.

Grammar (quantity.go, ``parseQuantityString``)::

    <quantity> ::= [+-] <digits> [ . <digits> ] <suffix>     (either digit run may be empty)
    <suffix>   ::= "" | n | u | m | k | M | G | T | P | E     (decimal SI)
                 | Ki | Mi | Gi | Ti | Pi | Ei                 (binary SI)
                 | (e|E) [+-] <digits>                         (decimal exponent)

Leading zeros are dropped, so ``"."``, ``"+"`` and ``"-"`` read as zero, as in Go. The
exponent is read as Go's ``strconv.ParseInt(.., 10, 64)``; upstream then truncates it to
int32, which would make ``1e4294967296`` equal to 1: cfnet refuses an exponent outside
int32 instead (``QuantityError``), the one place it is stricter than Kubernetes.

Values: a non-zero value is rounded up (away from zero) to a nano unit; ``MilliValue`` and
``Value`` are ``ceil`` of the value times 1000 or 1. A binary-SI value above 2^63-1 is
capped there (Kubernetes caps it); a value whose milli- or unit count would overflow int64
is refused, since Kubernetes documents that overflow as undefined. The number is never
computed exactly when it cannot matter: only the first 40 significant digits are kept
(plus a sticky digit that keeps ``ceil`` right) and magnitudes are compared by exponent
first, so ``1e999999999`` is refused in microseconds instead of building a billion-digit
integer.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_INT64 = 2**63 - 1
_INT32 = 2**31
_SIG_DIGITS = 40
_DEC = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BIN = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")


class QuantityError(ValueError):
    """Not a Kubernetes quantity, or one cfnet cannot count; the message is the reason."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """``sign * mantissa * 10**exp10 * 2**exp2``, mantissa trimmed to its significant
    digits (with a sticky last digit when more were given)."""

    negative: bool
    mantissa: int
    exp10: int
    exp2: int
    binary: bool  # a binary-SI suffix (capped at 2^63-1 like Kubernetes)

    def _log10_upper(self) -> int:
        """An integer ``k`` with ``|value| < 10**k`` (0 for a zero value)."""
        if self.mantissa == 0:
            return 0
        return len(str(self.mantissa)) + self.exp10 + (self.exp2 * 3 + 9) // 10 + 1

    def scaled(self, scale: int, what: str) -> int:
        """ceil(|value| * 10**scale) with the sign put back; Kubernetes' ``ScaledValue``
        (``MilliValue`` is scale 3, ``Value`` scale 0). Refuses an int64 overflow."""
        if self.mantissa == 0:
            return 0
        if self.binary and self._over_max_units():
            units = MAX_INT64  # ParseQuantity caps binary SI at MaxInt64
            out = units * 10**scale
        else:
            if self._log10_upper() + scale > 21:
                raise QuantityError(f"is too large: {what} above {MAX_INT64} cannot be counted")
            if self._log10_upper() + 9 < -2:
                # far below one nano unit: Kubernetes rounds it up to 1n, so ceil gives 1
                out = 1
            else:
                num = self.mantissa * 2**self.exp2
                e = self.exp10 + scale
                # ceil(num * 10**e) without floats
                out = num * 10**e if e >= 0 else -(-num // 10**-e)
        if out > MAX_INT64:
            raise QuantityError(f"is too large: {what} above {MAX_INT64} cannot be counted")
        return int(-out if self.negative else out)

    def _over_max_units(self) -> bool:
        if self._log10_upper() > 21:
            return True
        num = self.mantissa * 2**self.exp2
        if self.exp10 >= 0:
            return bool(num * 10**self.exp10 > MAX_INT64)
        return bool(num > MAX_INT64 * 10**-self.exp10)


def _scan(s: str) -> tuple[bool, str, str, str]:
    """Go's ``parseQuantityString``: (positive, numerator, denominator, suffix)."""
    pos, end, positive = 0, len(s), True
    if pos < end and s[0] in "+-":
        positive = s[0] == "+"
        pos += 1
    while pos < end and s[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "", ""
    start = pos
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    num = s[start:pos] or "0"
    denom = ""
    if pos < end and s[pos] == ".":
        pos += 1
        start = pos
        while pos < end and s[pos] in _DIGITS:
            pos += 1
        denom = s[start:pos]
    suffix_start = pos
    while pos < end and s[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and s[pos] in "+-":
        pos += 1
    while pos < end and s[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(f"{_show(s)} is not a quantity (number with an optional suffix: "
                            "n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or e<exponent>)")
    return positive, num, denom, s[suffix_start:]


def _show(s: str) -> str:
    return repr(s if len(s) <= 40 else s[:37] + "...")


def go_parse_int(s: str) -> int | None:
    """Go's ``strconv.ParseInt(s, 10, 64)`` (None: error): one optional sign and ASCII
    digits, in int64 range; no spaces, underscores or other digits as Python's int() takes.
    Also the rule for ``Gt``/``Lt`` label values."""
    body = s[1:] if s[:1] in ("+", "-") else s
    if not body or any(c not in _DIGITS for c in body):
        return None
    body = body.lstrip("0") or "0"
    if len(body) > 19:
        return None
    v = int(body) * (-1 if s[:1] == "-" else 1)
    return v if -MAX_INT64 - 1 <= v <= MAX_INT64 else None


def parse(text: str) -> Quantity:
    """A quantity string as :class:`Quantity`; ``QuantityError`` says why not."""
    if not text:
        raise QuantityError("'' is not a quantity")
    positive, num, denom, suf = _scan(text)
    exp10, exp2, binary = 0, 0, False
    if suf in _DEC:
        exp10 = _DEC[suf]
    elif suf in _BIN:
        exp2, binary = _BIN[suf], True
    elif len(suf) > 1 and suf[0] in "eE":
        e = go_parse_int(suf[1:])
        if e is None:
            raise QuantityError(f"{_show(text)}: exponent {_show(suf[1:])} is not an integer")
        if not -_INT32 <= e < _INT32:
            raise QuantityError(f"{_show(text)}: exponent {e} is out of range "
                                f"(Kubernetes keeps exponents as 32-bit integers)")
        exp10 = e
    else:
        raise QuantityError(f"{_show(text)}: unknown suffix {_show(suf)} (n u m k M G T P E, "
                            "Ki Mi Gi Ti Pi Ei, or e<exponent>)")
    digits = (num + denom).lstrip("0")
    exp10 -= len(denom)
    if not digits:
        return Quantity(False, 0, 0, 0, binary)
    stripped = digits.rstrip("0")
    exp10 += len(digits) - len(stripped)
    if len(stripped) > _SIG_DIGITS:
        # beyond 40 significant digits only "is anything left" matters for ceil; a sticky 1
        # one place further keeps that answer (values that large are refused anyway)
        exp10 += len(stripped) - _SIG_DIGITS - 1
        stripped = stripped[:_SIG_DIGITS] + "1"
    return Quantity(not positive, int(stripped), exp10, exp2, binary)
