"""Read what a Dockerfile runs: its ENTRYPOINT, CMD and ENV, without Docker.

Only the exec (JSON array) form of ENTRYPOINT/CMD is accepted: the shell form runs through
``/bin/sh -c`` and would need a shell to say what it runs, so it is an error here.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
"""The repository's ``docker/`` folder."""


@dataclass(frozen=True)
class ImageCommand:
    """What ``docker run IMAGE ARGS…`` runs for a Dockerfile.

    Attributes:
        entrypoint: the last ENTRYPOINT, as an argv list.
        cmd: the last CMD (the default ARGS when ``docker run`` is given none), as an argv list.
        env: the ENV settings, in order, later ones winning.
    """

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        """The command line of ``docker run IMAGE *args`` (CMD is replaced when args are given)."""
        return [*self.entrypoint, *(args or self.cmd)]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and ``\\`` continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, rest = full.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    if pending.strip():
        raise ValueError("the Dockerfile ends inside a continued line")
    return out


def _exec_form(keyword: str, rest: str) -> tuple[str, ...]:
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{keyword} must be in exec form (a JSON array of strings), got {rest!r}")
    return tuple(value)


def _env(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        return {words[0]: " ".join(words[1:])}
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"ENV word {word!r} is not KEY=value")
        pairs[key] = value
    return pairs


def image_command(path: str | Path) -> ImageCommand:
    """Parse ``path`` into its :class:`ImageCommand`.

    Raises:
        ValueError: no ENTRYPOINT, an ENTRYPOINT/CMD in shell form, or a malformed ENV.
    """
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = {}
    for keyword, rest in _instructions(Path(path).read_text()):
        if keyword == "ENTRYPOINT":
            entrypoint = _exec_form(keyword, rest)
        elif keyword == "CMD":
            cmd = _exec_form(keyword, rest)
        elif keyword == "ENV":
            env.update(_env(rest))
        elif keyword == "FROM":  # a new stage starts from its base image's settings
            entrypoint, cmd, env = None, (), {}
    if entrypoint is None:
        raise ValueError(f"{path}: no ENTRYPOINT in the last stage")
    return ImageCommand(entrypoint=entrypoint, cmd=cmd, env=env)
