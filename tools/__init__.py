"""The tool catalog. Importing this package registers every tool in `REGISTRY`.

Adding a tool is one `@tool`-decorated function in a module of this package: every module here is
imported below, so nothing else needs to change.
"""

import importlib
import pkgutil

from tools.registry import REGISTRY, Tool, ToolContext

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REGISTRY", "Tool", "ToolContext"]
