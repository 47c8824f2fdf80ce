"""JSON config files the services read at startup (tenants, prices), with errors that name them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: str | Path, what: str) -> Any:
    """The parsed JSON of `path`; a missing or malformed file is a ValueError naming `what`."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{what} file {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} file {path} is not valid JSON: {error}") from None
