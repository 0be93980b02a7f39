"""Test servers and data shared by the client, pipeline and end-to-end tests."""

from __future__ import annotations

from pathlib import Path

from rmserve.schema import Group, Message


def make_groups(n: int, *, domain: str = "chat", benchmark: str = "rm-bench") -> list[Group]:
    """``n`` RM-Bench-shaped groups (3 chosen, 3 rejected) with distinct response lengths."""
    return [
        Group(
            benchmark=benchmark,
            domain=domain,
            id=str(i),
            messages=(Message("user", f"question {i}"),),
            responses=tuple("x" * (10 * i + k + 1) for k in range(6)),
            num_chosen=3,
        )
        for i in range(n)
    ]


class SleepRecorder:
    """Stands in for ``asyncio.sleep`` in the client's retry loop: records, never waits."""

    def __init__(self) -> None:
        self.delays_s: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays_s.append(delay_s)



class ThreadedServer:
    """Serve an aiohttp app on 127.0.0.1 (a free port) from its own thread and event loop.

    ``make_app`` is called inside that loop. ``url`` is the base URL once started; ``app``
    the running application.
    """

    def __init__(self, make_app) -> None:
        self._make_app = make_app
        self.url: str | None = None
        self.app = None
        self._loop = None
        self._runner = None
        self._thread = None

    def __enter__(self) -> "ThreadedServer":
        import asyncio
        import threading

        from aiohttp import web

        started = threading.Event()
        failure: list[BaseException] = []

        async def setup() -> None:
            self.app = self._make_app()
            self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            host, port = self._runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"

        def main() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(setup())
            except BaseException as exc:  # reported to the test thread
                failure.append(exc)
                started.set()
                return
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="test-server", daemon=True)
        self._thread.start()
        started.wait(30)
        if failure:
            raise failure[0]
        return self

    def __exit__(self, *exc_info) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def write_jsonl(path: Path, rows) -> Path:
    """``rows`` (JSON-able dicts) written to ``path`` as JSON Lines; returns ``path``."""
    import orjson

    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


OVER_BUDGET_ROWS = [
    {"id": 0, "domain": "chat", "prompt": "p0", "chosen": ["c" * 3, "c" * 4, "c" * 5], "rejected": ["r", "rr", "rrr"]},
    {"id": 1, "domain": "chat", "prompt": "p1", "chosen": ["c" * 100, "c" * 101, "c" * 102],
     "rejected": ["r" * 5, "r" * 6, "r" * 7]},
    {"id": 2, "domain": "chat", "prompt": "p2", "chosen": ["a" * 3, "a" * 4, "a" * 5], "rejected": ["b", "bb", "bbb"]},
]
"""Three RM-Bench rows (chat 0, 1, 2) whose groups cost 60, 363 and 60 prompt tokens under the
fake chat template (a sequence is ``5 + len(prompt) + len(response)`` tokens): with a budget of
150 tokens a minute, chat 1 alone is over it and the other two fit."""


def write_rmbench_data(path: Path, *, n_chat: int = 6, n_code: int = 4) -> Path:
    """A small RM-Bench JSONL file (records carry ``domain``).

    chat: every chosen response is longer than every rejected one; code: every chosen one is
    shorter. With a reward that grows with length, every chat comparison is won and every
    code comparison lost.
    """
    rows = []
    for i in range(n_chat):
        rows.append({"id": i, "domain": "chat", "prompt": f"chat {i}",
                     "chosen": ["c" * (100 + k) for k in range(3)], "rejected": ["r" * (10 + k) for k in range(3)]})
    for i in range(n_code):
        rows.append({"id": i, "domain": "code", "prompt": f"code {i}",
                     "chosen": ["c" * (10 + k) for k in range(3)], "rejected": ["r" * (100 + k) for k in range(3)]})
    return write_jsonl(path, rows)


BIG_MAX_MODEL_LEN = 1_000_000
"""max_model_len of the fake model in end-to-end tests: the fake tokenizer is per character."""
