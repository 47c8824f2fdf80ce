"""`python -m sao_jax.seed inspect DIR [--tenant skills] [--task-type T] [--limit N]`."""

from __future__ import annotations

import argparse
import sys

from atdp_io import AtdpStore
from sao_jax.metrics import summary_table
from sao_jax.seed.bank import SKILLS_TENANT, load_skills


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sao_jax.seed", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser("inspect", help="print the skills of a skill bank")
    inspect.add_argument("path", help="ATDP store directory (a run's DIR/atdp)")
    inspect.add_argument("--tenant", default=SKILLS_TENANT, help="partition holding the skills")
    inspect.add_argument("--task-type", default=None, help="only skills of this task type")
    inspect.add_argument("--limit", type=int, default=20, help="newest N skills (default 20)")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    try:
        store = AtdpStore.open(args.path, create=False)
    except FileNotFoundError as error:
        parser.error(str(error))
    if args.tenant not in store.tenants():
        parser.error(f"{args.path} has no tenant {args.tenant!r}; it has {store.tenants()}")
    skills = load_skills(store, tenant=args.tenant, task_type=args.task_type, limit=args.limit)
    rows = [
        {
            "task type": s.skill.task_type,
            "outcome": "success" if s.skill.success else "failure",
            "analyzer": f"{s.skill.analyzer} ({s.skill.analyzer_version})",
            "episode": s.skill.trajectory_id,
            "skill": s.skill.text,
        }
        for s in skills
    ]
    print(f"{len(rows)} skill(s) in {args.path} [{args.tenant}]")
    if rows:
        print(summary_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
