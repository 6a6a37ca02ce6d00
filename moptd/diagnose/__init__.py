"""The diagnostician: YAML decision trees evaluated over the signal store.

Dependencies point one way: cli -> diagnose -> store/catalog. The engine is a pure function
of the store and the clock; the service adds the finding lifecycle on top.
"""
