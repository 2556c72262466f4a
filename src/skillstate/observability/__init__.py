"""What the proxy tells its operators: per-turn telemetry, Prometheus metrics and
OpenTelemetry traces."""
