"""Serving the run's engine to processes outside it: an OpenAI-compatible endpoint on 127.0.0.1 with a token."""
