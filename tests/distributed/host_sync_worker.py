"""One process of `test_host_sync.py`: exchanges host values with its peers and writes what it
received to OUT_DIR/process<i>.json.

    python host_sync_worker.py OUT_DIR     (env: SAO_COORDINATOR_ADDRESS, ... from local_launch)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sao_jax.distributed import initialize, shutdown
from sao_jax.distributed.host_sync import (
    allgather_json,
    allgather_numbers,
    any_process,
)


def main(out: Path) -> None:
    info = initialize()
    me = info.process_index
    record = {
        # a count beyond float32's exact integers, and a fraction
        "numbers": allgather_numbers([me + 0.5, 3 * 2**26 + me]).tolist(),
        "any_only_last": any_process(me == info.process_count - 1),
        "any_none": any_process(False),
        # different lengths per process, unicode
        "json": allgather_json({"process": me, "text": "é" * (me + 1), "list": list(range(me))}),
    }
    (out / f"process{me}.json").write_text(json.dumps(record))
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
