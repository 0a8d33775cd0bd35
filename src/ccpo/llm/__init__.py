"""The LLM side: price table, OpenAI-compatible client, cache, agents, tasks and collection."""
