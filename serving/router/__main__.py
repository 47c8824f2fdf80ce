"""`python -m serving.router --proxies URL[,URL] --workers URL[,URL]`: the router process."""

from __future__ import annotations

from serving.common.cli import parse_config
from serving.common.run import serve
from serving.router.app import create_app
from serving.router.config import RouterConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_config(RouterConfig, argv, __doc__, "python -m serving.router")
    serve(create_app(config), config.host, config.port, "serving.router")


if __name__ == "__main__":
    main()
