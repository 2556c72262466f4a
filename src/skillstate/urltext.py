"""Server URLs as shown to people (logs, errors, /health, CLI summaries)."""

from __future__ import annotations

from urllib.parse import unquote_plus

# The query parameters in which a store's or Redis's URL may carry a secret: asyncpg (like
# libpq) reads ``password`` and ``sslpassword`` there, redis-py ``password``. ``passfile``
# names a file (libpq's password file), not a secret: it stays readable.
SECRET_PARAMS = frozenset({"password", "sslpassword"})


def redacted(url: str) -> str:
    """``url`` (a store's or Redis's) with its passwords as ``***``, for logs, errors, /health
    and the CLI: the user part's (``user:***@``), a ``password`` or ``sslpassword`` query
    parameter's, and any fragment. It never parses the host or port, so a malformed URL (a
    port that is no number) is shown masked too, never an exception."""
    base, hash_mark, _fragment = url.partition("#")
    base, question_mark, query = base.partition("?")
    scheme, sep, rest = base.partition("://")
    # Up to the last "@": a password may hold "/" (urlsplit then sees no user part at all).
    # A URL whose authority is empty (sqlite:///path) has none, whatever "@" its path holds.
    if sep and "@" in rest and not rest.startswith("/"):
        user_part, _, host_and_path = rest.rpartition("@")
        if ":" in user_part:
            user = user_part.partition(":")[0]
            rest = f"{user}:***@{host_and_path}" if user else f"***@{host_and_path}"
    shown = scheme + sep + rest if sep else base
    if question_mark:
        shown += "?" + "&".join(_redacted_param(p) for p in query.split("&"))
    if hash_mark:
        shown += "#***"
    return shown


def _redacted_param(param: str) -> str:
    """One ``key=value`` of a query, its value ``***`` when the key names a secret (the key
    read as the drivers read it: %-escapes and ``+`` decoded, so ``pass%77ord`` is one)."""
    key, eq, _value = param.partition("=")
    if eq and unquote_plus(key).strip().lower() in SECRET_PARAMS:
        return f"{key}=***"
    return param


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
