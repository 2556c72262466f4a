"""Sessions: ids and the session header (``ids``), per-session turn serialisation in one
process (``locks``; the Redis leases live in skillstate.coordination)."""
