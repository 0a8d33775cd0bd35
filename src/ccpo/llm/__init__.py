"""The LLM side: OpenAI-compatible client, cache, agents, tasks and collection."""
