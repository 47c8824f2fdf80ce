"""`python -m sao_jax.seed inspect DIR [--tenant skills] [--task-type T] [--limit N]`."""

from __future__ import annotations

import dataclasses
import sys

from atdp_io import AtdpStore
from sao_jax.config_cli import ConfigError, parse_command
from sao_jax.metrics import summary_table
from sao_jax.seed.bank import SKILLS_TENANT, load_skills


@dataclasses.dataclass
class Inspect:
    """print the skills of a skill bank

    Attributes:
      path: ATDP store directory (a run's DIR/atdp).
      tenant: partition holding the skills.
      task_type: only skills of this task type.
      limit: the newest N skills.
    """

    path: str = dataclasses.field(metadata={"positional": True})
    tenant: str = SKILLS_TENANT
    task_type: str | None = None
    limit: int = 20

    def __post_init__(self):
        if self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")


def main(argv: list[str] | None = None) -> int:
    _, args = parse_command(
        argv, {"inspect": Inspect}, prog="python -m sao_jax.seed", description=__doc__
    )
    try:
        store = AtdpStore.open(args.path, create=False)
        if args.tenant not in store.tenants():
            raise ConfigError(
                f"{args.path} has no tenant {args.tenant!r}; it has {store.tenants()}"
            )
    except (FileNotFoundError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
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
