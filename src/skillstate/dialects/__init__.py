"""Wire formats: OpenAI chat completions, Anthropic Messages, and Server-Sent Events."""
