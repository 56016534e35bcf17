"""Kubernetes resource quantities ("1.5Gi", "500m", "2e6"), parsed and printed like kube-apiserver.

Why it exists: GPU pools, quotas and workloads carry TFLOPs, VRAM and percentages as Kubernetes
quantities. Two controllers (ours and the original) and kubectl must agree byte for byte on the
canonical form, or every reconcile looks like a change. This module follows the semantics of Go's
`k8s.io/apimachinery/pkg/api/resource.Quantity`:

* grammar: ``[+-]<digits>[.<digits>]<suffix>`` with the suffixes Ki Mi Gi Ti Pi Ei (BinarySI),
  n u m "" k M G T P E (DecimalSI) or ``e<int>`` / ``E<int>`` (DecimalExponent); ``5.`` and ``.5``
  are numbers; the exponent must fit a signed 32-bit integer;
* the value is exact; anything finer than 1n (10^-9) is rounded away from zero to the next nano,
  so a non-zero request never becomes zero;
* BinarySI values are capped at 2^63-1 in magnitude; a BinarySI value strictly between 0 and 1
  becomes DecimalSI;
* the canonical form keeps the parsed format: the mantissa is an integer and the suffix the
  largest one that loses nothing ("1024Mi" -> "1Gi", "0.5" -> "500m", "1.5Gi" -> "1536Mi"). A
  BinarySI value below 1024 in magnitude or with a fraction prints as DecimalSI ("1.5Ki" ->
  "1536", "0.5Ki" -> "512"). Values with no SI suffix big enough ("1000E", 2^70 bytes) print in
  exponent or plain decimal form ("1e21", "1180591620717411303424"), as apimachinery's newest tests
  require; older releases dropped the suffix and printed "1000E" as "1".

Deliberate differences from Go, all for input Go accepts only by accident:

* a number without any digit ("Ki", ".", "+", "-.") is rejected; Go reads it as 0, but the
  documented grammar and the CRD validation pattern of kubebuilder both reject it;
* surrounding whitespace is stripped, as kube-apiserver's JSON decoding does (Go's bare
  ParseQuantity rejects it);
* String() is always the canonical form; Go sometimes echoes a parsed string verbatim ("+1", "01");
* magnitudes of 10^1000 and more are rejected rather than stored.

Round trips: parse(str(q)) == q for every quantity a string can give (BinarySI values above 2^63-1,
reachable only by arithmetic, re-parse capped, as in Go). A BinarySI value printed without a binary
suffix ("9.765625Ki" -> "10000") re-parses as DecimalSI and then prints as "10k", exactly as Go does;
after that one round the string is stable.

`Quantity.value()` and `milli_value()` round away from zero like Go's Value()/MilliValue(): the
ceiling for positive values, the floor for negative ones.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from typing import Any, Final, Literal, TypeAlias

__all__ = ["FORMATS", "INT64_MAX", "Quantity", "QuantityError", "QuantityLike", "parse_quantity"]

Format: TypeAlias = Literal["BinarySI", "DecimalSI", "DecimalExponent"]
FORMATS: Final[tuple[str, ...]] = ("BinarySI", "DecimalSI", "DecimalExponent")

_NANO: Final = 10**9
#: the largest BinarySI magnitude Go keeps at parse time (2^63-1), in nanos
_BINARY_CAP_NANOS: Final = (2**63 - 1) * _NANO
#: values must stay below 10^_MAX_MAGNITUDE (a guard against exponents like 1e2000000000)
_MAX_MAGNITUDE: Final = 1000
_INT32_MAX: Final = 2**31 - 1
#: the largest value Go's Value()/MilliValue() return exactly (int64); readers that count in those
#: units refuse anything larger
INT64_MAX: Final = 2**63 - 1

_BINARY_SUFFIXES: Final[dict[str, int]] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}
_DECIMAL_BY_EXPONENT: Final[dict[int, str]] = {exp: sfx for sfx, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER: Final[dict[int, str]] = {bits // 10: sfx for sfx, bits in _BINARY_SUFFIXES.items()}

_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<int>[0-9]*)(?:\.(?P<frac>[0-9]*))?(?P<suffix>.*)", re.ASCII | re.DOTALL)
_EXPONENT_RE: Final = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)", re.ASCII)

ALLOWED: Final = ("a number with an optional sign and fraction, then an optional suffix "
                  "(Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E, or an exponent such as e3), "
                  "e.g. '1.5Gi', '500m', '2e6'")

QuantityLike: TypeAlias = "str | int | Decimal | float | Quantity"


class QuantityError(ValueError):
    """A string (or number) is not a Kubernetes quantity; the message quotes it and says why."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"invalid quantity {value!r}: {reason}; expected {ALLOWED}")


def _strip_zeros(n: int) -> tuple[int, int]:
    """n == m * 10**k with m not divisible by 10 (n != 0)."""
    k = 0
    while n % 1000 == 0:
        n //= 1000
        k += 3
    while n % 10 == 0:
        n //= 10
        k += 1
    return n, k


def _round_to_nanos(digits: str, exponent: int, text: object) -> int:
    """|value| = int(digits) * 10**exponent, in nanos rounded away from zero."""
    digits = digits.lstrip("0")
    if not digits:
        return 0
    if len(digits) + exponent > _MAX_MAGNITUDE:
        raise QuantityError(text, f"the magnitude must stay below 10^{_MAX_MAGNITUDE}")
    shift = exponent + 9
    if shift >= 0:
        scaled: int = int(digits) * 10**shift
        return scaled
    dropped = -shift
    if dropped >= len(digits):
        return 1  # a non-zero amount below one nano rounds up to 1n
    kept, rest = digits[:-dropped], digits[-dropped:]
    return int(kept) + (1 if rest.strip("0") else 0)


def _interpret_suffix(suffix: str, text: object) -> tuple[int, int, Format]:
    """(base, exponent, format) of a suffix, e.g. "Mi" -> (2, 20, BinarySI)."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], "DecimalSI"
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], "BinarySI"
    match = _EXPONENT_RE.fullmatch(suffix)
    if match is None:
        raise QuantityError(text, f"unknown suffix {suffix!r}")
    exponent = int(match.group("exp"))
    if abs(exponent) > _INT32_MAX:
        raise QuantityError(text, f"the exponent {exponent} does not fit a 32-bit integer")
    return 10, exponent, "DecimalExponent"


def _parse_text(original: object, text: str) -> tuple[int, Format]:
    text = text.strip()
    if not text:
        raise QuantityError(original, "it is empty")
    match = _QUANTITY_RE.fullmatch(text)
    assert match is not None  # the pattern matches any string
    int_part, frac_part = match.group("int"), match.group("frac") or ""
    if not int_part and not frac_part:
        raise QuantityError(original, "it has no digits before the suffix")
    base, exponent, fmt = _interpret_suffix(match.group("suffix"), original)
    digits = int_part + frac_part
    if base == 10:
        nanos = _round_to_nanos(digits, exponent - len(frac_part), original)
    else:
        significant = digits.lstrip("0")
        if len(significant) > _MAX_MAGNITUDE:
            raise QuantityError(original, f"a binary quantity may have at most {_MAX_MAGNITUDE} digits")
        # mantissa * 2**exponent / 10**len(frac), then rounded to nanos like a decimal number
        nanos = _round_to_nanos(str(int(significant or "0") << exponent), -len(frac_part), original)
    if fmt == "BinarySI":
        nanos = min(nanos, _BINARY_CAP_NANOS)
        if 0 < nanos < _NANO:
            fmt = "DecimalSI"  # as Go: a binary value below one prints (and is kept) as decimal
    return (-nanos if match.group("sign") == "-" else nanos), fmt


def _decimal_nanos(value: Decimal, original: object) -> int:
    if not value.is_finite():
        raise QuantityError(original, "it is not a finite number")
    sign, digit_tuple, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    nanos = _round_to_nanos("".join(map(str, digit_tuple)), exponent, original)
    return -nanos if sign else nanos


@functools.total_ordering
class Quantity:
    """An exact Kubernetes quantity that remembers its format; immutable and hashable."""

    __slots__ = ("_format", "_nanos")
    _nanos: int
    _format: Format

    def __init__(self, value: QuantityLike = 0) -> None:
        parsed = Quantity.parse(value) if not isinstance(value, Quantity) else value
        object.__setattr__(self, "_nanos", parsed._nanos)
        object.__setattr__(self, "_format", parsed._format)

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def _make(cls, nanos: int, fmt: Format) -> Quantity:
        self = object.__new__(cls)
        object.__setattr__(self, "_nanos", nanos)
        object.__setattr__(self, "_format", fmt)
        return self

    @classmethod
    def parse(cls, value: QuantityLike) -> Quantity:
        """Parse a quantity string, or take an int, Decimal or float (as JSON numbers are)."""
        if isinstance(value, Quantity):
            return value
        if isinstance(value, bool):
            raise QuantityError(value, "a boolean is not a quantity")
        if isinstance(value, int):
            return cls._make(value * _NANO, "DecimalSI")
        if isinstance(value, Decimal):
            return cls._make(_decimal_nanos(value, value), "DecimalSI")
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise QuantityError(value, "it is not a finite number")
            return cls._make(*_parse_text(value, repr(value)))  # the shortest exact text, as JSON has it
        if isinstance(value, str):
            return cls._make(*_parse_text(value, value))
        raise QuantityError(value, f"a {type(value).__name__} is not a quantity")

    @classmethod
    def from_int(cls, n: int, fmt: str = "DecimalSI") -> Quantity:
        """n units in the given format, e.g. from_int(80 * 2**30, "BinarySI") -> 80Gi."""
        return cls._make(n * _NANO, _check_format(fmt))

    @classmethod
    def from_milli(cls, n: int, fmt: str = "DecimalSI") -> Quantity:
        """n thousandths, e.g. from_milli(1500) -> 1500m."""
        return cls._make(n * 10**6, _check_format(fmt))

    @classmethod
    def from_decimal(cls, value: Decimal, fmt: str = "DecimalSI") -> Quantity:
        """An exact Decimal (rounded away from zero to 1n) in the given format."""
        return cls._make(_decimal_nanos(value, value), _check_format(fmt))

    # --- reading ---------------------------------------------------------------------------------

    @property
    def format(self) -> Format:
        return self._format

    @property
    def nanos(self) -> int:
        """The exact value in units of 10^-9 (every quantity is a whole number of nanos)."""
        return self._nanos

    @property
    def decimal(self) -> Decimal:
        """The exact value, without trailing zeros (Decimal("1.5"), Decimal("1E+3"))."""
        if self._nanos == 0:
            return Decimal(0)
        mantissa, tens = _strip_zeros(self._nanos)
        return Decimal(f"{mantissa}E{tens - 9}")

    def value(self) -> int:
        """The value rounded away from zero to an integer (Go's Value(); ceil for positive)."""
        return _away_from_zero(self._nanos, _NANO)

    def milli_value(self) -> int:
        """The value in thousandths rounded away from zero (Go's MilliValue())."""
        return _away_from_zero(self._nanos, 10**6)

    def round_up(self, scale: int) -> Quantity:
        """The value rounded away from zero to a multiple of 10^scale, format kept (Go's RoundUp).

        kube-apiserver applies round_up(-3) to every pod resource list, so "0.30000000000000004"
        in a pod's cpu request is stored as "301m".
        """
        if scale <= -9:
            return self
        unit = 10 ** (scale + 9)
        return Quantity._make(_away_from_zero(self._nanos, unit) * unit, self._format)

    def is_zero(self) -> bool:
        return self._nanos == 0

    def sign(self) -> int:
        return (self._nanos > 0) - (self._nanos < 0)

    # --- printing --------------------------------------------------------------------------------

    def __str__(self) -> str:
        return _text(self._nanos, self._format)

    def _written(self) -> str:
        if self._nanos == 0:
            return "0"
        fmt: Format = self._format
        if fmt == "BinarySI":
            text = self._binary_text()
            if text is not None:
                return text
            fmt = "DecimalSI"
        return self._decimal_text(fmt)

    def _binary_text(self) -> str | None:
        """The BinarySI form, or None where Go falls back to DecimalSI."""
        magnitude = abs(self._nanos)
        if magnitude < 1024 * _NANO or magnitude % _NANO:
            return None
        mantissa, power = magnitude // _NANO, 0
        while mantissa % 1024 == 0:
            mantissa //= 1024
            power += 1
        if power > 6:
            return None  # no suffix past Ei: print the exact decimal form rather than lose magnitude
        sign = "-" if self._nanos < 0 else ""
        return f"{sign}{mantissa}{_BINARY_BY_POWER.get(power, '')}"

    def _decimal_text(self, fmt: Format) -> str:
        mantissa, tens = _strip_zeros(abs(self._nanos))
        exponent = tens - 9
        extra = exponent % 3  # lower the exponent to a multiple of 3, growing the mantissa
        mantissa, exponent = mantissa * 10**extra, exponent - extra
        sign = "-" if self._nanos < 0 else ""
        if fmt == "DecimalSI" and exponent in _DECIMAL_BY_EXPONENT:
            suffix = _DECIMAL_BY_EXPONENT[exponent]
        else:
            suffix = f"e{exponent}" if exponent else ""
        return f"{sign}{mantissa}{suffix}"

    def to_json(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    # --- comparison ------------------------------------------------------------------------------

    def _other_nanos(self, other: object) -> int | None:
        if isinstance(other, Quantity):
            return other._nanos
        if isinstance(other, bool):
            return None
        if isinstance(other, int):
            return other * _NANO
        return None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Decimal):
            return other.is_finite() and self.decimal == other
        nanos = self._other_nanos(other)
        if nanos is None:
            return NotImplemented
        return self._nanos == nanos

    def __lt__(self, other: Quantity | int | Decimal) -> bool:
        if isinstance(other, Decimal):
            if other.is_nan():
                return NotImplemented
            return self.decimal < other
        nanos = self._other_nanos(other)
        if nanos is None:
            return NotImplemented
        return self._nanos < nanos

    def __hash__(self) -> int:
        return hash(self.decimal)  # equal to hash(int) / hash(Decimal) of the same value

    def __bool__(self) -> bool:
        return self._nanos != 0

    # --- arithmetic (Go's Add/Sub/Mul: the left side's format, unless it is zero) ----------------

    def _result_format(self, other: Quantity) -> Format:
        return other._format if self._nanos == 0 else self._format

    def __add__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return Quantity._make(self._nanos + other._nanos, self._result_format(other))

    def __radd__(self, other: int) -> Quantity:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # so that sum(quantities) works
        return NotImplemented

    def __sub__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return Quantity._make(self._nanos - other._nanos, self._result_format(other))

    def __mul__(self, other: int | Decimal) -> Quantity:
        if isinstance(other, bool):
            return NotImplemented
        if isinstance(other, int):
            return Quantity._make(self._nanos * other, self._format)
        if isinstance(other, Decimal):
            if not other.is_finite():
                raise QuantityError(other, "cannot multiply a quantity by a non-finite number")
            return Quantity._make(_product_nanos(self._nanos, other), self._format)
        return NotImplemented

    __rmul__ = __mul__

    def __neg__(self) -> Quantity:
        return Quantity._make(-self._nanos, self._format)

    def __pos__(self) -> Quantity:
        return self

    def __abs__(self) -> Quantity:
        return Quantity._make(abs(self._nanos), self._format)

    # --- immutability ----------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Quantity is immutable; cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Quantity is immutable; cannot delete {name}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Quantity._make, (self._nanos, self._format))

    def __copy__(self) -> Quantity:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Quantity:
        return self


def _check_format(fmt: str) -> Format:
    if fmt == "BinarySI":
        return "BinarySI"
    if fmt == "DecimalSI":
        return "DecimalSI"
    if fmt == "DecimalExponent":
        return "DecimalExponent"
    raise ValueError(f"unknown quantity format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _away_from_zero(nanos: int, unit: int) -> int:
    quotient = -(-abs(nanos) // unit)  # ceiling of the magnitude
    return quotient if nanos >= 0 else -quotient


def _product_nanos(nanos: int, factor: Decimal) -> int:
    """nanos * factor exactly, then rounded away from zero to a whole nano."""
    sign, digit_tuple, exponent = factor.as_tuple()
    assert isinstance(exponent, int)
    product = abs(nanos) * int("".join(map(str, digit_tuple)) or "0")
    # product * 10**exponent nanos; _round_to_nanos works in units, hence the -9
    result = _round_to_nanos(str(product), exponent - 9, factor)
    negative = (nanos < 0) != bool(sign)
    return -result if negative else result


def parse_quantity(value: QuantityLike) -> Quantity:
    """Quantity.parse as a function (raises QuantityError quoting the bad value)."""
    return Quantity.parse(value)


@functools.lru_cache(maxsize=4096)
def _text(nanos: int, fmt: Format) -> str:
    """A quantity's canonical text: the same few amounts are written for every pod (its requests and
    limits in annotations and in its workload), and finding the form costs divisions in a loop."""
    return Quantity._make(nanos, fmt)._written()
