"""`python -m serving.worker --config tiny --port 8101`: one worker process."""

from __future__ import annotations

from serving.common.cli import parse_config
from serving.common.run import serve
from serving.worker.app import create_app
from serving.worker.config import WorkerConfig


def main(argv: list[str] | None = None) -> None:
    config = parse_config(WorkerConfig, argv, __doc__, "python -m serving.worker")
    serve(create_app(config), config.host, config.port, "serving.worker")


if __name__ == "__main__":
    main()
