"""`moptd record`: write a moptd-bundle/v1 (docs/bundle.md) from the live host."""
