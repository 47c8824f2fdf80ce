"""The ALFWorld agent process of `experiments.online_sao` (`sao_jax.pipeline.online_agent`).

SAO_ADMIN_KEY=... python -m experiments.online_agent --url http://127.0.0.1:8000 ...
"""

from sao_jax.pipeline.online_agent import main

if __name__ == "__main__":
    raise SystemExit(main())
