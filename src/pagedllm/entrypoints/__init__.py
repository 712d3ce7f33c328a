"""User entry points: the offline `LLM` class and (later) the CLI and OpenAI server."""
