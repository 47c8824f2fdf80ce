"""`python -m serving.proxy --buffer DIR --router URL`: one data proxy process."""

from __future__ import annotations

from serving.common.cli import parse_config
from serving.common.run import serve
from serving.proxy.app import create_app
from serving.proxy.config import ProxyConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_config(ProxyConfig, argv, __doc__, "python -m serving.proxy")
    serve(create_app(config), config.host, config.port, "serving.proxy")


if __name__ == "__main__":
    main()
