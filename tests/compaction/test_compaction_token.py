"""The compaction token: sealed and opened under the server secret, refused when altered,
sealed elsewhere, truncated or not one at all; its content is not readable."""

from __future__ import annotations

import base64

import pytest

from skillstate.compaction.token import PREFIX, CompactionRef, TokenError, TokenSealer

SECRET = b"s" * 32
REF = CompactionRef("alice:codex-1", 7, "alice")


def test_a_sealed_token_opens_to_its_reference() -> None:
    sealer = TokenSealer(SECRET)
    token = sealer.seal(REF)
    assert token.startswith(PREFIX)
    assert sealer.open(token) == REF
    assert TokenSealer(SECRET).open(token) == REF  # another process, the same secret


def test_one_reference_seals_to_one_token_that_hides_it() -> None:
    sealer = TokenSealer(SECRET)
    a, b = sealer.seal(REF), sealer.seal(REF)
    assert a == b  # a synthetic nonce: a retried compaction gets the same item
    other = sealer.seal(CompactionRef(REF.session, REF.step + 1, REF.key))
    nonce = len(PREFIX) + 22  # 16 bytes of base64url
    assert other[:nonce] != a[:nonce]  # another reference, another nonce
    raw = base64.urlsafe_b64decode(a[len(PREFIX) :] + "==")
    for visible in (b"alice", b"codex-1", b'"n"'):
        assert visible not in raw


def _flip(token: str, at: int) -> str:
    body = bytearray(base64.urlsafe_b64decode(token[len(PREFIX) :] + "=="))
    body[at] ^= 1
    return PREFIX + base64.urlsafe_b64encode(bytes(body)).rstrip(b"=").decode()


@pytest.mark.parametrize("at", [0, 20, -1])  # the nonce, the ciphertext, the tag
def test_any_altered_byte_is_refused(at: int) -> None:
    sealer = TokenSealer(SECRET)
    with pytest.raises(TokenError, match="does not verify"):
        sealer.open(_flip(sealer.seal(REF), at))


@pytest.mark.parametrize(
    "token",
    [
        "",
        "TOKEN-V2-1",  # an upstream's own (or a forged) encrypted_content
        PREFIX,
        PREFIX + "AAAA",
        PREFIX + "!!!!not base64!!!!",
        PREFIX + "A" * 5000,
    ],
)
def test_what_is_no_token_is_refused(token: str) -> None:
    with pytest.raises(TokenError):
        TokenSealer(SECRET).open(token)


def test_a_token_from_another_secret_is_refused() -> None:
    token = TokenSealer(b"o" * 32).seal(REF)
    with pytest.raises(TokenError, match="does not verify"):
        TokenSealer(SECRET).open(token)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        TokenSealer(b"short")
