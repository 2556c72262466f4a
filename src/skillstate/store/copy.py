"""``skillstate store copy``: everything one store holds (sessions with their whole
transition history, client keys, stored responses, session budgets, the replies kept under
Idempotency-Keys, the ledger) copied into another, backend to backend through the ``Store``
protocol, in pages, then verified.

The destination must be empty unless ``merge``: then the copy adds to it, and refuses
before writing anything when a session id, key name, response id, session budget or
Idempotency-Key (in its scope) exists on both sides (nothing in the destination is ever
replaced). The source is only read.

Verification, after the copy: every count of the destination grew by the source's count;
every copied session has the source's step, schema and state (compared as canonical JSON);
the ledger's row, token and cost totals grew by the source's; every key has its digest.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..auth.keys import SECRET_FILE, server_secret
from .base import COUNTED, Store, StoreError
from .records import LedgerSums, SessionRecord

PAGE = 500  # rows per page read and written: what the copy holds in memory at once


class CopyRefused(StoreError):
    """The copy would overwrite or mix data: nothing was written."""


@dataclass
class CopyReport:
    """What was copied, and what the verification found wrong (``problems``: empty when
    everything matched)."""

    source: dict[str, int]
    before: dict[str, int]  # the destination's counts before the copy
    after: dict[str, int] = field(default_factory=dict)
    sessions_verified: int = 0
    problems: list[str] = field(default_factory=list)
    secret: str | None = None  # where the copied keys' secret went, when there were keys


Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


async def copy_store(
    source: Store,
    dest: Store,
    *,
    merge: bool = False,
    page: int = PAGE,
    progress: Progress = _quiet,
    source_dir: Path | None = None,
    dest_dir: Path | None = None,
) -> CopyReport:
    """Copy ``source`` into ``dest`` and verify it (see the module docstring). Raises
    CopyRefused before writing when the destination is not empty (without ``merge``) or
    shares ids with the source; StoreError when a read or write fails midway (the
    destination then holds part of the copy).

    Client keys are checked against a secret (``skillstate.auth.keys``): a PostgreSQL store
    keeps it, a SQLite store's is the ``auth.secret`` file of its data dir (``source_dir``,
    ``dest_dir``: the directory of each SQLite file). The source's goes with its keys."""
    report = CopyReport(await source.counts(), await dest.counts())
    if not merge and any(report.before.values()):
        raise CopyRefused(
            f"the destination is not empty ({_counted(report.before)}): copy into an empty"
            " store, or add to this one with --merge"
        )
    secret = await _secret(source, source_dir) if report.source["keys"] else None
    if merge:
        await _refuse_shared_ids(source, dest, page)
        theirs = await _secret(dest, dest_dir) if report.before["keys"] else secret
        if secret is not None and theirs != secret:
            raise CopyRefused(
                "--merge: the keys of the two stores are hashed with different secrets"
                " (one store can hold only one); nothing was copied"
            )
    ledger_before = await _ledger_totals(dest)
    progress("keys")
    for key in await source.keys():
        await dest.save_key(key, new=True)
    if secret is not None:
        report.secret = await _put_secret(dest, dest_dir, secret)
    progress("sessions and their transitions")
    fingerprints = await _copy_sessions(source, dest, page, progress)
    progress("stored responses")
    after: str | None = None
    while responses := await source.export_responses(after, page):
        for response in responses:
            await dest.put_response(response)
        after = responses[-1].id
    progress("session budgets")
    await _copy_budgets(source, dest, page)
    progress("replies kept under an Idempotency-Key")
    kept_after: tuple[str, str] | None = None
    while kept := await source.export_kept_replies(kept_after, page):
        for reply in kept:  # a retry after the copy replays the turn instead of running it
            await dest.keep_reply(reply, [])
        kept_after = (kept[-1].scope, kept[-1].key)
    progress("ledger")
    position, copied = 0, 0
    while True:
        rows, position = await source.export_ledger(position, page)
        if not rows:
            break
        await dest.add_ledger_rows(rows)
        copied += len(rows)
        if copied % (100 * page) < len(rows):
            progress(f"ledger: {copied:,} rows")
    progress("verifying")
    await _verify(source, dest, report, fingerprints, ledger_before, page)
    return report


async def _copy_sessions(
    source: Store, dest: Store, page: int, progress: Progress
) -> dict[str, bytes]:
    """Copy every session with its history; returns each one's fingerprint."""
    fingerprints: dict[str, bytes] = {}
    after: str | None = None
    while sessions := await source.export_sessions(after, page):
        for record in sessions:
            await dest.import_session(record)
            step = 0
            while history := await source.history_page(record.session, page, step):
                await dest.import_transitions(record.session, history)
                step = history[-1].step
            fingerprints[record.session] = _fingerprint(record)
        after = sessions[-1].session
        progress(f"sessions: {len(fingerprints):,}")
    return fingerprints


async def _shared_budgets(source: Store, dest: Store, page: int) -> list[str]:
    """The sessions with a budget on both sides (a session with no state row, in
    ``passthrough``, has one without being a session of ``export_sessions``)."""
    theirs: set[str] = set()
    after: str | None = None
    while budgets := await dest.export_session_budgets(after, page):
        theirs.update(s for s, _ in budgets)
        after = budgets[-1][0]
    shared: list[str] = []
    after = None
    while budgets := await source.export_session_budgets(after, page):
        shared += [f"session budget {s}" for s, _ in budgets if s in theirs]
        after = budgets[-1][0]
    return shared


async def _shared_kept(source: Store, dest: Store, page: int) -> list[str]:
    """The Idempotency-Keys kept on both sides (in the same scope)."""
    theirs: set[tuple[str, str]] = set()
    after: tuple[str, str] | None = None
    while kept := await dest.export_kept_replies(after, page):
        theirs.update((k.scope, k.key) for k in kept)
        after = (kept[-1].scope, kept[-1].key)
    shared: list[str] = []
    after = None
    while kept := await source.export_kept_replies(after, page):
        shared += [f"Idempotency-Key {k.key!r}" for k in kept if (k.scope, k.key) in theirs]
        after = (kept[-1].scope, kept[-1].key)
    return shared


async def _copy_budgets(source: Store, dest: Store, page: int) -> None:
    """Every session budget (``--merge`` refused shared ones before anything was written)."""
    after: str | None = None
    while budgets := await source.export_session_budgets(after, page):
        for session, usd in budgets:
            await dest.set_session_budget(session, usd, replace=False)
        after = budgets[-1][0]


def _fingerprint(record: SessionRecord) -> bytes:
    """Step, schema and state as canonical JSON, hashed: equal on both sides of a copy
    whatever each backend does to key order or spacing."""
    canonical = orjson.dumps(
        [record.step, record.schema, record.state], option=orjson.OPT_SORT_KEYS
    )
    return hashlib.blake2b(canonical, digest_size=16).digest()


async def _refuse_shared_ids(source: Store, dest: Store, page: int) -> None:
    """CopyRefused when a session id, key name or digest, response id or session budget is
    on both sides."""
    shared: list[str] = []
    src_keys = {k.name: k.digest for k in await source.keys()}
    for k in await dest.keys():
        if k.name in src_keys or k.digest in src_keys.values():
            shared.append(f"key {k.name}")
    dest_sessions: set[str] = set()
    cursor: tuple[float, str] | None = None
    while listed := await dest.sessions_page(page, cursor):
        dest_sessions.update(s["session"] for s in listed)
        cursor = (listed[-1]["updated"], listed[-1]["session"])
    after: str | None = None
    while sessions := await source.export_sessions(after, page):
        shared += [f"session {s.session}" for s in sessions if s.session in dest_sessions]
        after = sessions[-1].session
    dest_responses: set[str] = set()
    after = None
    while responses := await dest.export_responses(after, page):
        dest_responses.update(r.id for r in responses)
        after = responses[-1].id
    after = None
    while responses := await source.export_responses(after, page):
        shared += [f"response {r.id}" for r in responses if r.id in dest_responses]
        after = responses[-1].id
    shared += await _shared_budgets(source, dest, page)
    shared += await _shared_kept(source, dest, page)
    if shared:
        more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
        raise CopyRefused(
            f"--merge: {len(shared)} id(s) exist in both stores ({', '.join(shared[:5])}{more});"
            " nothing was copied"
        )


async def _verify(
    source: Store,
    dest: Store,
    report: CopyReport,
    fingerprints: dict[str, bytes],
    ledger_before: tuple[float, ...],
    page: int,
) -> None:
    problems = report.problems
    if report.source["keys"] and report.secret is None:
        problems.append(
            "client keys: the secret they were hashed with was not carried over (no"
            " auth.secret beside the source file?): they are refused until it is in place"
        )
    report.after = await dest.counts()
    if (now := await source.counts()) != report.source:
        problems.append(
            f"the source changed during the copy ({_counted(report.source)} before,"
            f" {_counted(now)} after): stop every proxy using it and copy again"
        )
    for name in COUNTED:
        want = report.before[name] + report.source[name]
        if report.after[name] != want:
            problems.append(f"{name}: {report.after[name]:,} in the destination, expected {want:,}")
    after: str | None = None
    while sessions := await dest.export_sessions(after, page):
        for record in sessions:
            expected = fingerprints.pop(record.session, None)
            if expected is None:
                continue  # the destination's own session (--merge)
            if _fingerprint(record) != expected:
                problems.append(f"session {record.session}: step, schema or state differ")
            else:
                report.sessions_verified += 1
        after = sessions[-1].session
    problems += [f"session {s}: missing in the destination" for s in sorted(fingerprints)[:20]]
    source_ledger, ledger_after = await _ledger_totals(source), await _ledger_totals(dest)
    grown = tuple(a - b for a, b in zip(ledger_after, ledger_before, strict=True))
    # USD to a millionth of a cent: each backend adds the floats in its own order
    if grown[:-1] != source_ledger[:-1] or abs(grown[-1] - source_ledger[-1]) > 1e-8:
        problems.append(
            "ledger totals (rows, input, output, cache tokens, USD) grew by"
            f" {grown}, expected {source_ledger}"
        )
    dest_keys = {k.name: k.digest for k in await dest.keys()}
    for key in await source.keys():
        if dest_keys.get(key.name) != key.digest:
            problems.append(f"key {key.name}: missing or with another digest")


async def _ledger_totals(store: Store) -> tuple[float, ...]:
    """Rows, input, output, cache read and write tokens, and USD of the whole ledger."""
    sums: list[LedgerSums] = await store.ledger_sums(0.0, float("inf"))
    return (
        sum(s.rows for s in sums),
        sum(s.input_tokens for s in sums),
        sum(s.output_tokens for s in sums),
        sum(s.cache_read_tokens + s.cache_write_tokens for s in sums),
        math.fsum(s.cost_usd for s in sums),
    )


async def _secret(store: Store, data_dir: Path | None) -> bytes | None:
    """The secret ``store``'s keys are hashed with: its own, else its data dir's file (read
    only: None when there is none)."""
    shared = await store.shared_secret()
    if shared is not None or data_dir is None or not (data_dir / SECRET_FILE).is_file():
        return shared
    return server_secret(data_dir)


async def _put_secret(dest: Store, data_dir: Path | None, secret: bytes) -> str | None:
    """Make ``secret`` the destination's; where it went (None: nowhere to put it)."""
    if await dest.set_shared_secret(secret):
        return "kept in the destination store"
    if data_dir is None:
        return None
    server_secret(data_dir, replace=secret)
    return f"written to {data_dir / SECRET_FILE}"


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[name]:,} {name}" for name in COUNTED)
