"""`python -m serving.router --proxies URL[,URL] --workers URL[,URL]`: the router process."""

from __future__ import annotations

from sao_jax.config_cli import parse_cli
from serving.common.run import serve
from serving.router.app import create_app
from serving.router.config import RouterConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_cli(argv, RouterConfig, prog="python -m serving.router", description=__doc__)
    serve(create_app(config), config.host, config.port, "serving.router")


if __name__ == "__main__":
    main()
