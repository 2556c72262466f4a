"""One client turn, sequenced: lock, load, plan the context, call (and re-ask), judge, commit."""
