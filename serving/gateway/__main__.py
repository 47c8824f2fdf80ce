"""`python -m serving.gateway --router URL --proxies URL[,URL] --admin-key KEY --state-dir DIR`:
the public gateway process (the admin key may also come from SAO_ADMIN_KEY)."""

from __future__ import annotations

from sao_jax.config_cli import parse_cli
from serving.common.run import serve
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_cli(argv, GatewayConfig, prog="python -m serving.gateway", description=__doc__)
    serve(create_app(config), config.host, config.port, "serving.gateway")


if __name__ == "__main__":
    main()
