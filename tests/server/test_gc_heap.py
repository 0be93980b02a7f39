"""The heap frozen after a load and unfrozen around a checkpoint swap (``server/swaps/gc_heap.py``).

What is checked is what freezing is for and what it must not break: a frozen object survives
a full collection even once it is garbage in a reference cycle (so full passes need not walk
it), and a swap unfreezes first, so the old model's cycles are collected. Each test leaves
the test process's heap unfrozen.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from testkit.fakes import FakeRenderer, RestartableFakeEngine
from rmserve.server.swaps.gc_heap import GC_HEAP_KEY, GcHeap
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from test_swap import TOKEN, load
from test_swap_restart import ckpts  # noqa: F401 - the fixture


@pytest.fixture(autouse=True)
def thawed_after():
    yield
    gc.unfreeze()


class _Node:
    """An object that can hold a reference cycle and be weakly referenced."""

    other: _Node | None = None


def _garbage_cycle() -> weakref.ref:
    """A two-object cycle nothing else refers to; returns a weak reference to one of them."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_freeze_keeps_a_cycle_from_full_collections_until_a_swap_unfreezes():
    heap = GcHeap()
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    assert heap.freeze("loading m") is True
    assert heap.frozen_objects > 0 and gc.get_freeze_count() > 0 and heap.freezes == 1
    del a, b  # now garbage, but frozen
    gc.collect()
    assert alive() is not None
    with heap.unfrozen("swap"):
        assert gc.get_freeze_count() == 0
        assert heap.freeze("another model's load") is False  # not during a swap
    assert alive() is None  # collected by the freeze that ended the swap
    assert heap.freezes == 2 and gc.get_freeze_count() > 0


def test_a_failed_swap_freezes_again():
    heap = GcHeap()
    heap.freeze("loading m")
    with pytest.raises(RuntimeError), heap.unfrozen("swap"):
        raise RuntimeError("the new checkpoint did not load")
    assert heap.freezes == 2 and gc.get_freeze_count() > 0


def test_thaw_at_the_end_lets_frozen_garbage_go():
    heap = GcHeap()
    alive = _garbage_cycle()
    heap.freeze("loading m")  # collects the cycle first: it was garbage already
    assert alive() is None
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    kept = weakref.ref(a)
    heap.freeze("loading n")
    del a, b
    heap.thaw()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert kept() is None


def test_unfrozen_objects_are_collected_as_usual():
    GcHeap().freeze("loading m")
    alive = _garbage_cycle()  # made after the freeze
    gc.collect()
    assert alive() is None


async def test_app_freezes_after_its_load_and_around_a_restart(aiohttp_client, ckpts):  # noqa: F811
    engine = RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"]))
    config = ServerConfig(port=0, admin_token=TOKEN, checkpoint_roots=(str(ckpts["root"]),))
    app = create_app(config, engine, renderer_factory=lambda loaded: FakeRenderer(max_model_len=loaded.info.max_model_len))
    heap = app[GC_HEAP_KEY] = GcHeap()
    engine.old_model = _Node()
    engine.old_model.other = _Node()
    engine.old_model.other.other = engine.old_model
    old = weakref.ref(engine.old_model)
    client = await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    assert app[STATE_KEY].status == "ready"
    assert heap.freezes == 1 and gc.get_freeze_count() > 0
    del engine.old_model  # what the old checkpoint held: garbage once it is swapped out
    gc.collect()
    assert old() is not None  # frozen
    status, body = await load(client, "wider", ckpts["wider"])
    assert status == 200, body
    assert engine.restarts == [str(ckpts["wider"].resolve())]
    assert heap.freezes == 2 and gc.get_freeze_count() > 0
    assert old() is None


async def test_app_without_a_heap_freezes_nothing(aiohttp_client, ckpts):  # noqa: F811
    app = create_app(ServerConfig(port=0), RestartableFakeEngine(checkpoint_dir=str(ckpts["step-0"])),
                     renderer_factory=lambda loaded: FakeRenderer(max_model_len=loaded.info.max_model_len))
    await aiohttp_client(app)
    await app[STATE_KEY].settled.wait()
    assert app[STATE_KEY].status == "ready" and gc.get_freeze_count() == 0
