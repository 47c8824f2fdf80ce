"""OpenAI-compatible serving that records live traffic as ATDP training data.

Four services, each a folder with `app.py` (`create_app(config)`), `config.py` (a dataclass)
and `client.py` (an in-process and an HTTP client with the same methods):

    agent (openai client) ──► gateway ──► router ──► data proxy ──► worker
                              auth,       session     chat template,   continuous batching
                              sessions,   pinning,    ATDP recording,  over the KV-cache
                              validation  placement   tool calls       sampler, weight swaps

`python -m serving` runs all four in one process; `python -m serving.<part>` runs one. See
docs/serving.md.
"""
