"""``rmserve serve`` with a fake judge engine: the real command line, config checks, app and
shutdown, with :class:`testkit.judge_fakes.FakeJudgeEngine` in place of the engine
``build_engine`` would load (no model). Usage: ``python judge_serve.py MODEL --kind judge …``
(any ``rmserve serve`` arguments); ``rmserve run``'s pipeline starts it as its serve command.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: makes ``testkit`` importable


def main() -> None:
    from testkit.judge_fakes import FakeJudgeEngine

    import rmserve.server.engines.registry as backends
    from rmserve.cli import main as cli_main
    from rmserve.schema import ModelInfo

    def fake_build_engine(config):
        if config.kind != "judge":
            raise SystemExit(f"judge_serve: --kind judge expected, got {config.kind}")
        model = ModelInfo(name=Path(config.model).name or config.model, max_model_len=100_000, dtype="float32",
                          fingerprint="fp-judge-1", engine="fake")
        return FakeJudgeEngine(model=model, max_tokens=config.judge_max_tokens)

    backends.build_engine = fake_build_engine
    sys.argv = ["rmserve", "serve", *sys.argv[1:]]
    cli_main()


if __name__ == "__main__":
    main()
