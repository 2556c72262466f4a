"""The command line: `skillstate` (serve) and its subcommands (cost, store, migrate, keys, demo,
bench)."""
