"""Token-length distributions (``--input-tokens`` and ``--output-tokens``).

Grammar (lengths in tokens, every drawn value rounded and clipped to ``[min, max]``):

- ``512``: fixed;
- ``128:1024``: uniform over the integers 128..1024 (both included);
- ``mean=512,sd=128`` or ``normal:mean=512,sd=128``: normal;
- ``lognormal:mean=512,sd=128``: lognormal whose own mean and standard deviation (not
  those of the logarithm) are the given ones;

normal and lognormal take ``,min=A,max=B`` too (default 1 and the option's limit).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:  # numpy is imported where it is used
    import numpy as np


__all__ = ["LengthDist", "parse_dist"]

#: The largest length any distribution draws (the default ``max``).
MAX_TOKENS_LIMIT = 131072
#: The largest ``max_tokens`` a request may carry (``--max-tokens``, a dataset's
#: ``max_tokens``): what the servers' 32-bit token counts hold.
MAX_REQUEST_TOKENS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class LengthDist:
    """A parsed length distribution.

    Attributes:
        kind: "fixed", "uniform", "normal" or "lognormal".
        a, b: fixed: (value, value); uniform: (low, high); normal and lognormal: (mean, sd).
        lo, hi: every drawn value is clipped to [lo, hi].
        text: the text it was parsed from.
    """

    kind: str
    a: float
    b: float
    lo: int
    hi: int
    text: str

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths (int64), drawn with ``rng``, rounded and clipped to [lo, hi]."""
        import numpy as np

        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1, n).astype(np.float64)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b, n)
        else:
            sigma2 = math.log1p((self.b / self.a) ** 2)
            x = rng.lognormal(math.log(self.a) - sigma2 / 2, math.sqrt(sigma2), n)
        out: np.ndarray = np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)
        return out

    def describe(self) -> Dict[str, Any]:
        """The distribution for the result document."""
        out: Dict[str, Any] = {"spec": self.text, "kind": self.kind}
        if self.kind == "fixed":
            out["value"] = int(self.a)
        elif self.kind == "uniform":
            out.update(low=int(self.a), high=int(self.b))
        else:
            out.update(mean=self.a, sd=self.b, min=self.lo, max=self.hi)
        return out


def _number(key: str, value: str, text: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{text!r}: {key}={value!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{text!r}: {key} must be finite")
    return x


def _length(value: str, text: str, limit: int, low: int = 1, unit: str = "tokens") -> int:
    try:
        x = int(value)
    except ValueError:
        raise ValueError(f"{text!r}: {value!r} is not a whole number of {unit}") from None
    if not low <= x <= limit:
        raise ValueError(f"{text!r}: {x} is not in {low}..{limit}")
    return x


def parse_dist(text: str, limit: int = MAX_TOKENS_LIMIT, low: int = 1, unit: str = "tokens") -> LengthDist:
    """The :class:`LengthDist` of ``text`` (module doc for the grammar), over whole
    ``unit`` from ``low`` to ``limit`` (tokens from 1 by default; think times in ms from 0).

    Raises:
        ValueError: the text is not a distribution; the message shows the forms.
    """
    s = str(text).strip().replace(" ", "")
    forms = "use 512, 128:1024, mean=512,sd=128 or lognormal:mean=512,sd=128 (with optional ,min=A,max=B)"
    if not s:
        raise ValueError(f"an empty distribution; {forms}")
    kind = "normal"
    if s.startswith(("normal:", "lognormal:")):
        kind, _, s = s.partition(":")
    elif "=" not in s:
        if ":" in s:
            low_s, _, high = s.partition(":")
            lo, hi = _length(low_s, text, limit, low, unit), _length(high, text, limit, low, unit)
            if lo > hi:
                raise ValueError(f"{text!r}: the uniform range's low end {lo} is above its high end {hi}")
            return LengthDist("uniform", lo, hi, lo, hi, str(text))
        n = _length(s, text, limit, low, unit)
        return LengthDist("fixed", n, n, n, n, str(text))
    params: Dict[str, float] = {}
    for part in s.split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in ("mean", "sd", "min", "max") or key in params:
            raise ValueError(f"{text!r}: {part!r} is not one of mean=, sd=, min=, max= (once each); {forms}")
        params[key] = _number(key, value, text)
    if "mean" not in params or "sd" not in params:
        raise ValueError(f"{text!r}: a {kind} distribution needs mean= and sd=; {forms}")
    mean, sd = params["mean"], params["sd"]
    if mean <= 0 or sd < 0:
        raise ValueError(f"{text!r}: mean must be > 0 and sd >= 0")
    lo = _length(str(int(params.get("min", low))), text, limit, low, unit)
    hi = _length(str(int(params.get("max", limit))), text, limit, low, unit)
    if lo > hi:
        raise ValueError(f"{text!r}: min {lo} is above max {hi}")
    return LengthDist(kind, mean, sd, lo, hi, str(text))
