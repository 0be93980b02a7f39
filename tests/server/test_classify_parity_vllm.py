"""``POST /classify`` and ``POST /pooling`` parity: the same requests to vLLM's own
OpenAI-compatible server (CPU build, :func:`testkit.openai_server.vllm_openai_server`) and to
``rmserve serve``, both over the demo reward model with the same engine settings, give the same
JSON fields and values within 1e-5.

What verl and vLLM clients read is compared field by field: ``id`` (its form), ``object``,
``created``, ``model``, ``data[i]`` (``index``, ``label``, ``probs`` / ``data``,
``num_classes``, ``object``) and ``usage``. Where rmserve differs on purpose (docs/rlhf.md,
"Parity with vLLM"), the difference itself is asserted:

- ``"activation": false`` (verl's field): vLLM 0.32 ignores it and answers σ(reward); rmserve
  answers the raw reward — so vLLM's values are σ of rmserve's, and rmserve's are vLLM's own
  ``"use_activation": false`` values;
- ``usage.prompt_tokens_details``: vLLM's pooling routes send null (even with
  ``--enable-prompt-tokens-details``); rmserve sends ``{"cached_tokens": N}``;
- the random part of ``id`` without a ``request_id``: 16 hex digits on vLLM, 32 on rmserve;
- the extra ``rmserve`` member (``activation``, ``fingerprint``), which vLLM clients ignore.
"""

from __future__ import annotations

import json
import math
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rmserve.pipelines.launch import ServerProcess, free_loopback_port
from testkit.openai_server import vllm_openai_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SERVED = "demo-rm"
MAX_MODEL_LEN = 4096
ATOL = 1e-5
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Name a prime number."}, {"role": "assistant", "content": "Seven, which is prime."}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."}],
]


@pytest.fixture(scope="module")
def servers(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(vLLM's base URL, rmserve's base URL), both serving the demo RM as ``demo-rm`` with
    the same engine settings (float32, eager, block size 32, prefix caching, max_num_seqs 32,
    max length 4096, 1 GiB of KV cache)."""
    port = free_loopback_port()
    log = tmp_path_factory.mktemp("classify-parity") / "rmserve.log"
    argv = [sys.executable, "-m", "rmserve.cli", "serve", str(demo_model_dir), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", SERVED, "--dtype", "float32",
            "--max-model-len", str(MAX_MODEL_LEN), "--block-size", "32", "--enforce-eager", "--max-num-seqs", "32",
            "--kv-cache-memory-bytes", str(1 << 30)]
    with ServerProcess(argv, url=f"http://127.0.0.1:{port}", log_path=log, startup_timeout_s=900,
                       stop_grace_s=30) as rmserve:
        with vllm_openai_server(demo_model_dir, served_model_name=SERVED, max_model_len=MAX_MODEL_LEN,
                                max_num_seqs=32, start_timeout_s=900,
                                extra_args=("--kv-cache-memory-bytes", str(1 << 30))) as base:
            rmserve.wait_ready()
            yield base.removesuffix("/v1"), rmserve.url


@pytest.fixture(scope="module")
def texts(demo_model_dir: Path) -> list[str]:
    """The conversations rendered by the RM tokenizer's chat template (as verl renders them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(demo_model_dir))
    return [tokenizer.apply_chat_template(c, tokenize=False) for c in CONVERSATIONS]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            assert reply.status == 200
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{url}: {exc.code} {exc.read()[:500]!r}") from None


def values(reply: dict, route: str) -> list[float]:
    """The one value per input: ``probs[-1]`` (classify, what verl reads) or ``data[-1]``."""
    key = "probs" if route == "/classify" else "data"
    return [entry[key][-1] for entry in reply["data"]]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def assert_same_shape(route: str, vllm: dict, ours: dict, n: int, request_id: str | None = None) -> None:
    """Every field but the values: keys, id form, object, created, model, entries, usage."""
    shape = route.strip("/")
    assert set(ours) - {"rmserve"} == set(vllm), (sorted(ours), sorted(vllm))
    if request_id is not None:
        assert ours["id"] == vllm["id"] == f"{shape}-{request_id}"
    else:
        assert re.fullmatch(rf"{shape}-[0-9a-f]{{16}}", vllm["id"]), vllm["id"]
        assert re.fullmatch(rf"{shape}-[0-9a-f]{{32}}", ours["id"]), ours["id"]  # documented: 32 hex digits
    assert ours["object"] == vllm["object"] == "list"
    assert isinstance(ours["created"], int) and abs(ours["created"] - vllm["created"]) < 600
    assert ours["model"] == vllm["model"] == SERVED
    assert len(ours["data"]) == len(vllm["data"]) == n
    for mine, theirs in zip(ours["data"], vllm["data"], strict=True):
        assert set(mine) == set(theirs)
        assert {k: v for k, v in mine.items() if k not in ("probs", "data")} == {
            k: v for k, v in theirs.items() if k not in ("probs", "data")}  # index, label, num_classes, object
        assert len(mine["probs" if route == "/classify" else "data"]) == 1
    usage, theirs = ours["usage"], vllm["usage"]
    assert set(usage) == set(theirs)
    assert [usage[k] for k in ("prompt_tokens", "total_tokens", "completion_tokens", "completion_tokens_details")] == [
        theirs[k] for k in ("prompt_tokens", "total_tokens", "completion_tokens", "completion_tokens_details")]
    assert theirs["prompt_tokens_details"] is None  # vLLM 0.32's pooling routes
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens"}  # rmserve: the prefix-cache hits


@pytest.mark.parametrize("route", ["/classify", "/pooling"])
def test_the_same_requests_give_the_same_fields_and_values(servers, texts, route):
    vllm_url, rmserve_url = servers
    both = {}
    for name, switch in [("activation", {"activation": False}), ("use_activation", {"use_activation": False}),
                         ("neither", {})]:
        body = {"model": SERVED, "input": texts, **switch}
        vllm, ours = post(vllm_url + route, body), post(rmserve_url + route, body)
        assert_same_shape(route, vllm, ours, len(texts))
        both[name] = (values(vllm, route), values(ours, route), ours["rmserve"])

    raw_vllm, raw_ours, note = both["use_activation"]
    assert raw_ours == pytest.approx(raw_vllm, abs=ATOL)  # the raw rewards
    assert note["activation"] == "none"

    sig_vllm, sig_ours, note = both["neither"]
    assert sig_ours == pytest.approx(sig_vllm, abs=ATOL)
    assert sig_vllm == pytest.approx([sigmoid(v) for v in raw_vllm], abs=ATOL)
    assert min(abs(s - r) for s, r in zip(sig_vllm, raw_vllm, strict=True)) > 0.1  # the two are told apart below
    assert note["activation"] == "sigmoid"

    # "activation": false — the documented difference: vLLM 0.32 ignores it (σ), rmserve does not (raw).
    act_vllm, act_ours, note = both["activation"]
    assert act_vllm == pytest.approx(sig_vllm, abs=ATOL)
    assert act_ours == pytest.approx(raw_vllm, abs=ATOL)
    assert note["activation"] == "none"


def test_request_id_text_without_special_tokens_and_token_ids(servers, texts, demo_model_dir):
    from transformers import AutoTokenizer

    vllm_url, rmserve_url = servers
    ids = AutoTokenizer.from_pretrained(str(demo_model_dir))(texts[1], add_special_tokens=False)["input_ids"]
    for body, n in [
        ({"model": SERVED, "input": texts, "use_activation": False, "request_id": "r1"}, 3),
        ({"model": SERVED, "input": texts[0], "add_special_tokens": False, "use_activation": False}, 1),
        ({"model": SERVED, "input": ids, "use_activation": False}, 1),
        ({"model": SERVED, "input": [ids, ids[:-1]], "use_activation": False}, 2),
    ]:
        vllm, ours = post(vllm_url + "/classify", body), post(rmserve_url + "/classify", body)
        assert_same_shape("/classify", vllm, ours, n, request_id=body.get("request_id"))
        assert values(ours, "/classify") == pytest.approx(values(vllm, "/classify"), abs=ATOL)
    assert ours["usage"]["prompt_tokens"] == vllm["usage"]["prompt_tokens"] == len(ids) + len(ids) - 1
