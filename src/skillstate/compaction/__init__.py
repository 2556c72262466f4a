"""Compaction served from the session's state: the compaction token (``token``), the
Responses API's compaction items (``items``), the state a token pins (``pinned``) and
Anthropic context editing applied by the proxy (``edits``). The routes are in
``skillstate.web.compaction``; docs/compaction.md says what each client gets."""
