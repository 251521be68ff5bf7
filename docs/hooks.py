"""MkDocs hooks (`hooks:` in mkdocs.yml): the site's name carries the package version, read from
`mmpe.__version__` when the site is built, so every page's header says which mmpe it documents."""

from __future__ import annotations

from typing import Any


def on_config(config: Any) -> Any:
    import mmpe

    config["site_name"] = f"mmpe {mmpe.__version__}"
    return config
