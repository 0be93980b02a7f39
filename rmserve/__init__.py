"""rmserve: a serving-backed scorer for reward models.

Stages (one folder each, installed under this package):
``rmserve.server`` (HTTP scoring server around an engine), ``rmserve.client`` (async client,
score files), ``rmserve.metrics`` (official benchmark figures). Shared records live in
:mod:`rmserve.schema`, errors in :mod:`rmserve.errors`, dataset loaders in
:mod:`rmserve.datasets`.
"""

__version__ = "0.1.0"

# In a source checkout the stage folders (server/, client/, metrics/) sit beside this
# package rather than inside it; setuptools maps them when installing. Make
# ``rmserve.server`` etc. resolve in a checkout too, so ``python -m rmserve.cli`` and the
# tests behave the same whether rmserve is installed, installed editable, or not at all.
def _map_source_tree() -> None:
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isfile(
        os.path.join(root, "server", "__init__.py")
    ) and not os.path.isdir(os.path.join(here, "server")):
        __path__.append(root)  # type: ignore[name-defined]  # noqa: F821


_map_source_tree()
del _map_source_tree
