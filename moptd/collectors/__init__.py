"""Collectors, one module each; importing the package registers every collector module.

A module registers itself with ``@register``; helper modules (parsers, backends) simply
register nothing.
"""

import importlib
import pkgutil

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_info.name}")
