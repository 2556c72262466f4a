"""Talking to upstream LLM servers: retries, failover and circuit breaking."""
