"""`python -m serving.gateway --router URL --proxies URL[,URL] --admin-key KEY --state-dir DIR`:
the public gateway process (the admin key may also come from SAO_ADMIN_KEY)."""

from __future__ import annotations

from serving.common.cli import parse_config
from serving.common.run import serve
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_config(GatewayConfig, argv, __doc__, "python -m serving.gateway")
    serve(create_app(config), config.host, config.port, "serving.gateway")


if __name__ == "__main__":
    main()
