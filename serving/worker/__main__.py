"""`python -m serving.worker --config tiny --port 8101`: one worker process."""

from __future__ import annotations

from sao_jax.config_cli import parse_cli
from serving.common.run import serve
from serving.worker.app import create_app
from serving.worker.config import WorkerConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_cli(argv, WorkerConfig, prog="python -m serving.worker", description=__doc__)
    serve(create_app(config), config.host, config.port, "serving.worker")


if __name__ == "__main__":
    main()
