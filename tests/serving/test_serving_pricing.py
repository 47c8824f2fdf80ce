"""The price table: per-model USD per 1M prompt / completion tokens, a wildcard, unknown
models unpriced (None, not free), and price files refused with a message naming the field."""

import json

import pytest

from serving.proxy.config import ProxyConfig
from serving.proxy.pricing import Price, PriceTable


def test_cost_follows_the_table_and_unknown_models_are_unpriced():
    table = PriceTable.from_json(
        {"models": {"small": {"prompt_usd_per_1m": 0.5, "completion_usd_per_1m": 2}}}
    )
    assert table.cost("small", 1_000_000, 0) == pytest.approx(0.5)
    assert table.cost("small", 2_000, 500) == pytest.approx((2_000 * 0.5 + 500 * 2) / 1e6)
    assert table.cost("small", 0, 0) == 0.0
    assert table.cost("large", 10, 10) is None
    assert PriceTable().cost("small", 10, 10) is None


def test_the_wildcard_prices_every_model_not_named():
    table = PriceTable({"a": Price(1.0, 1.0), "*": Price(10.0, 20.0)})
    assert table.cost("a", 1_000_000, 1_000_000) == pytest.approx(2.0)
    assert table.cost("b", 1_000_000, 1_000_000) == pytest.approx(30.0)


@pytest.mark.parametrize(
    "data, fragment",
    [
        ([], "expected {'models'"),
        ({"model": {}}, "expected {'models'"),
        ({"models": {}, "extra": 1}, "expected {'models'"),
        ({"models": {"m": {"prompt_usd_per_1m": 1}}}, "exactly the fields"),
        (
            {"models": {"m": {"prompt_usd_per_1m": 1, "completion_usd_per_1m": 1, "x": 0}}},
            "exactly",
        ),
        ({"models": {"m": {"prompt_usd_per_1m": -1, "completion_usd_per_1m": 1}}}, ">= 0"),
        ({"models": {"m": {"prompt_usd_per_1m": "1", "completion_usd_per_1m": 1}}}, ">= 0"),
        ({"models": {"m": {"prompt_usd_per_1m": True, "completion_usd_per_1m": 1}}}, ">= 0"),
        (
            {"models": {"m": {"prompt_usd_per_1m": float("nan"), "completion_usd_per_1m": 1}}},
            ">= 0",
        ),
        ({"models": {"m": 3}}, "exactly the fields"),
    ],
)
def test_bad_price_tables_name_what_is_wrong(data, fragment):
    with pytest.raises(ValueError, match="prices") as error:
        PriceTable.from_json(data)
    assert fragment in str(error.value)


def test_price_files(tmp_path):
    path = tmp_path / "prices.json"
    with pytest.raises(ValueError, match="does not exist"):
        PriceTable.from_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        PriceTable.from_file(path)
    path.write_text(
        json.dumps({"models": {"m": {"prompt_usd_per_1m": 3, "completion_usd_per_1m": 4}}})
    )
    assert PriceTable.from_file(path).price("m") == Price(3.0, 4.0)


@pytest.mark.parametrize("every_s", [0, -5.0])
def test_the_purge_period_must_be_positive_or_off(every_s):
    with pytest.raises(ValueError, match="purge_every_s"):
        ProxyConfig(buffer="/tmp/x", purge_every_s=every_s)
    assert ProxyConfig(buffer="/tmp/x", purge_every_s=None).purge_every_s is None
