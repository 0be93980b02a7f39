"""The engine seam: what an engine's ``LoadedModel`` record gives the app, and nothing else.

The app reads the renderer and the checkpoint folder from the record ``start`` returns (no
engine attributes); :func:`~rmserve.server.http.serve.engine_renderer` is the factory that takes
the engine's own renderer.
"""

from __future__ import annotations

import dataclasses

import msgspec
from testkit.fakes import FAKE_MODEL, FakeEngine, FakeRenderer, write_fake_checkpoint
from rmserve.server.http.app import STATE_KEY, ServerConfig, create_app
from rmserve.server.engines.protocol import LoadedModel, local_checkpoint
from rmserve.server.http.serve import engine_renderer

from rmserve.errors import ServerFault


@dataclasses.dataclass
class RenderingEngine(FakeEngine):
    """A fake engine that builds its own renderer, as the real engines do."""

    own_renderer: FakeRenderer | None = None

    def loaded(self) -> LoadedModel:
        return dataclasses.replace(super().loaded(), renderer=self.own_renderer)


async def test_engine_renderer_takes_the_renderer_from_the_loaded_record(aiohttp_client, tmp_path):
    own = FakeRenderer(max_model_len=32)
    folder = write_fake_checkpoint(tmp_path / "ckpt", 0.0)
    engine = RenderingEngine(own_renderer=own, checkpoint_dir=str(folder))
    app = create_app(ServerConfig(port=0, served_model_name="served"), engine, renderer_factory=engine_renderer)
    await aiohttp_client(app)
    state = app[STATE_KEY]
    await state.settled.wait()
    assert state.status == "ready"
    assert state.renderer is own
    assert state.checkpoint_dir == folder.resolve()
    assert state.info == msgspec.structs.replace(FAKE_MODEL, name="served")


async def test_engine_without_a_renderer_fails_the_start_with_engine_renderer(aiohttp_client):
    app = create_app(ServerConfig(port=0), FakeEngine(), renderer_factory=engine_renderer)
    await aiohttp_client(app)
    state = app[STATE_KEY]
    await state.settled.wait()
    assert state.status == "failed"
    assert isinstance(state.error, ServerFault)
    assert state.error.message == "the fake engine returned no renderer with its model"


def test_local_checkpoint_is_a_resolved_folder_or_none(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    assert local_checkpoint(str(folder)) == folder.resolve()
    assert local_checkpoint(folder / "missing") is None
    assert local_checkpoint("org/hub-model") is None
    assert local_checkpoint(None) is None


async def test_start_record_of_the_fake_names_its_checkpoint(tmp_path):
    folder = write_fake_checkpoint(tmp_path / "ckpt", 0.0)
    loaded = await FakeEngine(checkpoint_dir=str(folder)).start()
    assert loaded == LoadedModel(info=FAKE_MODEL, renderer=None, checkpoint_dir=folder.resolve())
