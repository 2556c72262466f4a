"""The cost model: token usage and estimates, prices, what the full transcript would have cost
(baseline), the ledger rows, the per-turn meter, cache hints and auto mode's estimates."""
