"""The envelope engine: find the envelope in a reply (patch), validate and merge it (RFC 7386),
judge the turn (verdict), build what goes upstream (context, mask), constrain decoding, and strip
the envelope from what the client sees (stripper, strip_events). Pure: no I/O."""
