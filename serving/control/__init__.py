"""The evolution control plane's served state: each tenant's versioned composite policy.

`composite.py` holds the five parts (policy, harness, memory, tools, governance) and their
fingerprints; `store.py` keeps one append-only history per tenant; `apply.py` applies a
composite to a chat request (what the model sees) and names it for ATDP attribution;
`cli.py` is `python -m serving.control`. See docs/control_plane.md.
"""
