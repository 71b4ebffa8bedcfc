"""Shared plumbing below the roles: Kafka clients and followers (`kafka`), the one `Settings` object
(`settings`) and metrics/health endpoints (`telemetry`). Gateways, controllers, workers, projectors and
benches import it; it imports only `schemas` and `engine`, never a role or the CLI."""
