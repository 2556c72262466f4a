"""``skillstate replay``: the user's own agent logs through every proxy mode.

One concern per module: :mod:`.jsonstream` (reading without holding a file whole),
:mod:`.claudecode`, :mod:`.codex` and :mod:`.transcripts` (the formats), :mod:`.sources`
(files, detection, problems), :mod:`.session` (the replayable form), :mod:`.forms` (request
bytes per dialect), :mod:`.upstream` (the simulated provider that answers with the recorded
replies), :mod:`.run` (the arms), :mod:`.report` and :mod:`.html` (the outputs) and
:mod:`.cli`. Verbatim reach is :mod:`skillstate.bench.reach` (shared with the benches).
"""
