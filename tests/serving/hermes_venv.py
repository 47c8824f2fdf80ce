"""The virtualenv Hermes Agent runs in for `test_serving_hermes.py`: `.venv-hermes/` at the repo
root (git-ignored), created with hermes-agent==HERMES_VERSION from the package registry when
missing. Hermes pins its own `openai` (2.24.0), so it never goes into the project's venv.

    python tests/serving/hermes_venv.py     # create it (what .ci/run does before the tests)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERMES_VERSION = "0.19.0"
REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-hermes"


def installed_version(venv: Path = VENV) -> str | None:
    """The hermes-agent version installed in `venv`, or None (no venv, not installed)."""
    python = venv / "bin" / "python"
    if not (python.is_file() and (venv / "bin" / "hermes").is_file()):
        return None
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('hermes-agent'))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_hermes_venv(venv: Path = VENV, timeout_s: float = 1800) -> Path:
    """`venv`'s `hermes` executable, creating the venv first when it lacks hermes-agent
    HERMES_VERSION. Raises RuntimeError with pip's output when the install fails."""
    if installed_version(venv) != HERMES_VERSION:
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"hermes-agent=={HERMES_VERSION}",
            ],
        ]
        for step in steps:
            run = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s)
            if run.returncode != 0:
                raise RuntimeError(
                    f"creating {venv} failed ({' '.join(step)} exited {run.returncode}); it "
                    "needs the package registry (pip). Output:\n"
                    + (run.stdout + run.stderr)[-3000:]
                )
        if installed_version(venv) != HERMES_VERSION:
            raise RuntimeError(f"{venv}: hermes-agent {HERMES_VERSION} did not install")
    return venv / "bin" / "hermes"


if __name__ == "__main__":
    print(ensure_hermes_venv())
