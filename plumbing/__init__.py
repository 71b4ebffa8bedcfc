"""Shared plumbing below the roles: Kafka clients and followers (`kafka`), the one `Settings` object
(`settings`) and metrics/health endpoints (`telemetry`). Gateways, controllers, workers, projectors and
benches import it; it imports only `schemas`, never the engine, a role or the CLI."""
