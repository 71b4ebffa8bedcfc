"""Metrics and health endpoints shared by every role."""
