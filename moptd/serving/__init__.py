"""The serving layer: engine /metrics and log parsing, probes, and the managed serving process."""
