"""`moptd record`: write a moptd-bundle/v1 (spec/bundle.md) from the live host."""
