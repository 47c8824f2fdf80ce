"""The evolution control plane: each tenant's versioned composite policy, and the loop that
changes it from the deployment's own trajectories.

Served state: `composite.py` holds the five parts (policy, harness, memory, tools, governance)
and their fingerprints; `store.py` keeps one append-only history per tenant; `apply.py` applies
a composite to a chat request (what the model sees); `canary.py` serves a tenant's newest
version to a share of its sessions.

The loop: `window.py` reads a window of ATDP trajectories, `facts.py` and `analysis.py` group
their failures into modes, `candidates.py` and `proposers.py` make candidate actions per
surface, `gate.py` scores each before it ships (`rescoring.py`, `replaying.py`, canary
evidence; `evidence.py`, `stats.py`), `choice.py` picks one, `deploy.py` promotes it, watches
live traffic and rolls back, `audit.py` logs every decision, `plane.py` runs a round.
`cli.py` is `python -m serving.control`. See docs/control_plane.md.
"""
