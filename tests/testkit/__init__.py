"""Helpers shared by the test folders: fakes of the engine, a wire stub, in-thread servers, data.

Importable as ``testkit`` because pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in
pyproject); nothing here is loaded by file path.
"""
