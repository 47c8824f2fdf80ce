"""`python -m serving --config tiny --port 8000 --buffer DIR --admin-key KEY`: gateway, router,
one data proxy and one worker in one process (see docs/serving.md).

`python -m serving --upstream http://host:8000/v1 --buffer DIR --admin-key KEY`: gateway, router
and data proxy in front of another OpenAI-compatible server, recording its traffic."""

from __future__ import annotations

import sys

from sao_jax.config_cli import parse_cli
from serving.common.run import serve
from serving.local import LocalServerConfig, create_local_server


def main(argv: list[str] | None = None) -> None:
    config = parse_cli(argv, LocalServerConfig, prog="python -m serving", description=__doc__)
    if not config.admin_key:
        sys.exit("error: --admin-key (or SAO_ADMIN_KEY) is required")
    server = create_local_server(config)
    serve(server.app, config.host, config.port, "serving")


if __name__ == "__main__":
    main()
