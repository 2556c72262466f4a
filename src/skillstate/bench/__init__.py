"""Benchmarks and the offline demo: a simulated model, workloads, a two-arm runner, reports."""
