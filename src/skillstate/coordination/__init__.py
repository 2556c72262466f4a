"""What replicas share through Redis (the ``coordination`` setting): the link to Redis and
its failure policy (``link``), per-session turn leases (``leases``), and the rate windows
and breakers built on the same link.

Without ``coordination`` nothing here talks to Redis: one process coordinates itself in
memory, as a single proxy always has."""

from .link import LOCAL, CoordinationLink

__all__ = ["LOCAL", "CoordinationLink"]
