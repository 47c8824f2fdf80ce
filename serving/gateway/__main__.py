"""`python -m serving.gateway --router URL --proxies URL[,URL] --admin-key KEY --state-dir DIR`:
the public gateway process."""

from __future__ import annotations

import os

from serving.common.cli import parse_config
from serving.common.run import serve
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig


def main(argv: list[str] | None = None) -> None:
    if "SAO_ADMIN_KEY" in os.environ and argv is None:
        import sys

        argv = sys.argv[1:]
        if "--admin-key" not in argv:
            argv = [*argv, "--admin-key", os.environ["SAO_ADMIN_KEY"]]
    config = parse_config(GatewayConfig, argv, __doc__)
    serve(create_app(config), config.host, config.port, "serving.gateway")


if __name__ == "__main__":
    main()
