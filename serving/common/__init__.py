"""Pieces every service shares: OpenAI errors, request validation, metrics, model loading."""
