"""The fine-tuning tasks: every module of this package defines and registers some.

Importing the package imports each of its modules, in name order, so a new task is one new
module here (see bertjax.finetune.task for the contract); nothing else lists them.
"""

import importlib
import pkgutil

for _module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.{_module.name}")
