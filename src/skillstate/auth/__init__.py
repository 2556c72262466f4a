"""Client keys, authentication, tenancy and per-key limits (see SECURITY.md)."""
