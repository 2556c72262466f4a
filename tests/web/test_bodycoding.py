"""Decoding compressed request bodies: the codings a header names, each coding undone in
reverse order, the decoded size capped, and data that is not what its coding says refused."""

from __future__ import annotations

import gzip
import zlib

import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from skillstate.errors import ProxyError
from skillstate.web.bodycoding import codings, decode

ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}


def test_codings_in_applied_order_identity_dropped_and_aliases_folded() -> None:
    assert codings("") == []
    assert codings("identity") == []
    assert codings(" GZIP ") == ["gzip"]
    assert codings("x-gzip") == ["gzip"]
    assert codings("deflate, identity, zstd") == ["deflate", "zstd"]


@pytest.mark.parametrize("header", ["br", "compress", "gzip, br", "zstd;q=1"])
def test_an_unknown_coding_is_a_415_naming_it(header: str) -> None:
    with pytest.raises(ProxyError) as e:
        codings(header)
    assert e.value.status == 415
    assert "not supported" in e.value.message


@given(st.binary(max_size=4096), st.lists(st.sampled_from(sorted(ENCODERS)), max_size=3))
def test_decode_undoes_any_chain_of_codings(data: bytes, chain: list[str]) -> None:
    raw = data
    for coding in chain:
        raw = ENCODERS[coding](raw)
    assert decode(raw, chain, max_bytes=4096) == data


def test_raw_deflate_without_the_zlib_wrapper_is_accepted() -> None:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = c.compress(b'{"model": "m"}') + c.flush()
    assert decode(raw, ["deflate"], 1024) == b'{"model": "m"}'


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_a_body_that_inflates_past_the_cap_is_a_413(coding: str) -> None:
    bomb = ENCODERS[coding](b"0" * 10_000_000)
    assert len(bomb) < 20_000
    with pytest.raises(ProxyError) as e:
        decode(bomb, [coding], max_bytes=1_000_000)
    assert e.value.status == 413
    assert decode(ENCODERS[coding](b"0" * 1_000_000), [coding], 1_000_000) == b"0" * 1_000_000


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_truncated_plain_or_trailing_data_is_a_400(coding: str) -> None:
    whole = ENCODERS[coding](b'{"model": "m-1", "input": "hello there"}')
    for bad in (whole[:-4], b'{"model": "m-1"}', whole + b"junk", b""):
        with pytest.raises(ProxyError) as e:
            decode(bad, [coding], 1024)
        assert e.value.status == 400, bad
        assert f"not valid {coding}" in e.value.message
