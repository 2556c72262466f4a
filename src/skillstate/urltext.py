"""Server URLs as shown to people (logs, errors, /health, CLI summaries)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redacted(url: str) -> str:
    """``url`` without its password (a store's or Redis's), for logs, errors and /health."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    user = f"{parts.username}:***@" if parts.username else "***@"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))


def masked(url: str) -> str:
    """``url`` with its whole user part (``user:password@``), query and fragment replaced by
    ``***``: an upstream's URL as a log or error line shows it, whatever is wrong with it
    (it never parses the URL, so a malformed one is masked too)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    rest, tail = rest[:cut], rest[cut:]
    if "@" in rest:  # up to the last "@": a password may hold "/" (then urlsplit errs)
        rest = "***@" + rest.rpartition("@")[2]
    out = scheme + sep + rest
    if tail:
        out += tail[0] + "***"
    return out
