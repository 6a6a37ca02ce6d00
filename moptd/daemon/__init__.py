"""The daemon: collector runtime, exporter, local API, lifecycle."""
