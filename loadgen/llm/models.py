"""Model mixes (``--model a=3,b=1``): the models of an OpenAI-compatible run and their
weights, and each prepared request's model drawn by weight with the run's sample seed.

One name (``--model NAME``) is a run of that model alone, as it always was; LoRA
adapters served under their own names are models like any other.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["ModelMix", "parse_model_mix"]

# Added to the sample seed for the models' own stream, so that a mix does not change the
# prompts drawn from the sample seed itself.
_MODEL_STREAM = 0x6D6F64656C  # "model"


@dataclasses.dataclass(frozen=True)
class ModelMix:
    """The models of a run with their weights (positive; shares are weight / sum)."""

    names: Tuple[str, ...]
    weights: Tuple[float, ...]

    @property
    def mixed(self) -> bool:
        """More than one model: each request's model is drawn."""
        return len(self.names) > 1

    def shares(self) -> List[float]:
        """Each model's expected share of the requests, in order."""
        total = sum(self.weights)
        return [w / total for w in self.weights]

    def draw(self, seed: int, count: int) -> List[int]:
        """``count`` model indices drawn by weight from ``seed`` (the run's sample seed):
        the same seed gives the same models."""
        import numpy as np

        if not self.mixed:
            return [0] * count
        rng = np.random.default_rng([seed, _MODEL_STREAM])
        return [int(i) for i in rng.choice(len(self.names), size=count, p=self.shares())]

    def describe(self) -> List[Dict[str, Any]]:
        """The mix for the result: each model's name, weight and expected share."""
        return [{"name": n, "weight": w, "share": s} for n, w, s in zip(self.names, self.weights, self.shares())]


def parse_model_mix(text: Optional[str]) -> Optional[ModelMix]:
    """``NAME`` or ``NAME=WEIGHT,NAME=WEIGHT,...`` (a name without ``=WEIGHT`` weighs 1)
    as a :class:`ModelMix`; None for no ``--model``.

    Raises:
        ValueError: an empty name, a weight that is not a positive finite number, or a
            name given twice; the message names the part.
    """
    if text is None:
        return None
    names: List[str] = []
    weights: List[float] = []
    for part in text.split(","):
        name, eq, weight_text = part.strip().rpartition("=") if "=" in part else (part.strip(), "", "")
        name = name.strip()
        if not name:
            raise ValueError(f"{part.strip()!r} has no model name (allowed: NAME or NAME=WEIGHT,NAME=WEIGHT,...)")
        weight = 1.0
        if eq:
            try:
                weight = float(weight_text)
            except ValueError:
                raise ValueError(f"{part.strip()!r}: the weight must be a number, got {weight_text.strip()!r}") from None
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"{part.strip()!r}: the weight must be a positive number, got {weight_text.strip()!r}")
        if name in names:
            raise ValueError(f"model {name!r} is given twice")
        names.append(name)
        weights.append(weight)
    return ModelMix(tuple(names), tuple(weights))
