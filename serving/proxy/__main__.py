"""`python -m serving.proxy --buffer DIR --router URL`: one data proxy process."""

from __future__ import annotations

from sao_jax.config_cli import parse_cli
from serving.common.run import serve
from serving.proxy.app import create_app
from serving.proxy.config import ProxyConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_cli(argv, ProxyConfig, prog="python -m serving.proxy", description=__doc__)
    serve(create_app(config), config.host, config.port, "serving.proxy")


if __name__ == "__main__":
    main()
