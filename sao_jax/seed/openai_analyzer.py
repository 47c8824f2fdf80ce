"""An analyzer behind any OpenAI-compatible endpoint (a strong external model, or our gateway).

Uses the official `openai` client; the episodes of one call are sent concurrently (one chat
completion each) and come back in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from sao_jax.seed.analyzers import Analyzer
from sao_jax.seed.records import EpisodeRecord
from sao_jax.seed.templates import analysis_text

SYSTEM_PROMPT = (
    "You analyse finished episodes of a household agent and answer with one short skill, "
    "one or two sentences, nothing else."
)


class OpenAIAnalyzer(Analyzer):
    """Skills from `model` at `base_url` (e.g. "http://127.0.0.1:8000/v1").

    Args:
      base_url: the endpoint's OpenAI base URL (ending in /v1).
      model: model name sent with each request.
      api_key: bearer key ("EMPTY" for endpoints that need none).
      max_tokens: cap on a skill's tokens.
      temperature: sampling temperature.
      max_actions: actions of the episode the prompt shows (the last ones).
      concurrency: requests in flight at once.
      timeout_s: per-request timeout; errors are raised, naming the episode.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        max_tokens: int = 96,
        temperature: float = 0.0,
        max_actions: int = 12,
        concurrency: int = 8,
        timeout_s: float = 60.0,
    ):
        import openai

        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIAnalyzer: base_url must be an http(s) URL, got {base_url!r}")
        self.client = openai.OpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=1
        )
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.max_actions, self.concurrency = max_actions, max(1, concurrency)
        self.name = f"openai:{model}"

    @property
    def version(self) -> str:
        return f"{self.model}@{self.client.base_url}"

    def analyze_texts(self, records: Sequence[EpisodeRecord]) -> list[str]:
        with ThreadPoolExecutor(min(self.concurrency, len(records))) as pool:
            return list(pool.map(self._one, records))

    def _one(self, record: EpisodeRecord) -> str:
        try:
            reply = self.client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {
                        "role": "user",
                        "content": analysis_text(record, max_actions=self.max_actions),
                    },
                ],
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
        except Exception as error:
            raise RuntimeError(
                f"{self.name}: analysis of episode {record.trajectory_id!r} failed: {error}"
            ) from error
        text = (reply.choices[0].message.content or "").strip()
        if not text:
            raise RuntimeError(f"{self.name}: empty skill for episode {record.trajectory_id!r}")
        return text
