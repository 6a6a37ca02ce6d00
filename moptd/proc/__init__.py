"""/proc and /sys helpers: the /proc file parsers, kept-open /proc files, process info and
cgroups, and the one PCI address normaliser."""
