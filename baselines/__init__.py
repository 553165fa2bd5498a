"""Comparison methods for robust federated aggregation (RFA paper Section 5.2).

The gathering baselines (coordinate-wise median, trimmed mean, Krum, centered
clipping) see every client's update at the server: they are NOT compatible with secure
aggregation. Build any aggregator by name with `baselines.registry.aggregator_from_name`.
"""
