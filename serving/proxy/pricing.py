"""The price table: what one call costs, in US dollars, from its token counts.

A prices file (JSON) gives, per served model id, US dollars per million prompt tokens and per
million completion tokens; `"*"` prices every model not named:

    {"models": {"sao-tiny": {"prompt_usd_per_1m": 0.15, "completion_usd_per_1m": 0.60},
                "*":        {"prompt_usd_per_1m": 1.00, "completion_usd_per_1m": 3.00}}}

A model without a price (and no `"*"`) costs None: unknown, not free, so `cost_usd` stays
empty in the ATDP metadata and the cost counters do not move.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving.common.config_files import read_json_file

WILDCARD = "*"
_FIELDS = ("prompt_usd_per_1m", "completion_usd_per_1m")


@dataclasses.dataclass(frozen=True)
class Price:
    """US dollars per million prompt / completion tokens."""

    prompt_usd_per_1m: float
    completion_usd_per_1m: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.prompt_usd_per_1m + completion_tokens * self.completion_usd_per_1m
        ) / 1e6


class PriceTable:
    """Prices by model id (see the module docstring)."""

    def __init__(self, prices: Mapping[str, Price] | None = None):
        self.prices = dict(prices or {})

    @classmethod
    def from_json(cls, data: Any, where: str = "prices") -> PriceTable:
        """Builds the table from the prices file's JSON; ValueError names the bad field."""
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict) or set(data) != {"models"}:
            raise ValueError(f"{where}: expected {{'models': {{model_id: {{...}}}}}}")
        prices = {}
        for model, entry in models.items():
            at = f"{where}: model {model!r}"
            if not isinstance(entry, dict) or set(entry) != set(_FIELDS):
                raise ValueError(f"{at}: expected exactly the fields {list(_FIELDS)}")
            for field in _FIELDS:
                value = entry[field]
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or value < 0
                ):
                    raise ValueError(f"{at}: {field} must be a finite number >= 0, got {value!r}")
            prices[model] = Price(*(float(entry[f]) for f in _FIELDS))
        return cls(prices)

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        path = Path(path)
        data = read_json_file(path, "prices")
        return cls.from_json(data, str(path))

    def price(self, model: str) -> Price | None:
        return self.prices.get(model, self.prices.get(WILDCARD))

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        """US dollars of one call, or None when `model` has no price."""
        price = self.price(model)
        return None if price is None else price.cost(prompt_tokens, completion_tokens)
