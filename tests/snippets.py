"""Load the docs' one-file extensions (``docs/snippets/<name>.py``) once per test session.

Each file registers its layer, kernel or matcher on import; a second import would define a
second class under the same name, so every test shares one module object.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SNIPPETS = Path(__file__).resolve().parents[1] / "docs" / "snippets"


def load(name: str) -> ModuleType:
    """The module of ``docs/snippets/<name>.py`` (imported on first use)."""
    key = f"docs_snippets_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, SNIPPETS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod
