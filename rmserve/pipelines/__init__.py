"""Pipelines that join the stages: ``eval`` (data → client → score file/store → metrics),
``run`` (start a server, then eval) and ``sweep`` (checkpoints × servers).

This is the one layer that may import every stage (:mod:`rmserve.server` only to launch it as a
process, :mod:`rmserve.client`, :mod:`rmserve.metrics`); the stages never import it or each other.
"""
