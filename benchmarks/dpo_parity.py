"""Parity of a DPO run's rewards with a transformers computation of the official formula.

Reads the ``scores.jsonl`` of a ``rmserve run/eval`` of a DPO policy (``--kind dpo``), picks
``--per-domain`` groups spread evenly over each domain of the data (first, last and evenly in
between, in data order), recomputes every response's implicit reward from the text with
``tests/testkit/dpo_reference.py`` — its own chat-template calls and tokenization, the
official steps of allenai/reward-bench ``rewardbench/dpo.py`` (prompt/answer split, BPE
boundary fix, BOS, EOS), one unpadded transformers forward per sequence — and compares.
The reward mode and compat are taken from the score records. Exit status 1 when a reward
differs by more than ``--atol``.

    python benchmarks/dpo_parity.py --scores runs/dpo/scores.jsonl --policy POLICY \\
        [--ref-model REF] --data ../shared/data/rm-bench --per-domain 5

Results: ``<out>/<date>-<machine>-dpo-parity.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))  # testkit: the independent reference


def spread(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)``, first and last included (all when k ≥ n)."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scores", type=Path, required=True, help="scores.jsonl of a --kind dpo run")
    parser.add_argument("--policy", required=True, help="the policy checkpoint the run scored")
    parser.add_argument("--ref-model", default=None, help="its reference (for mode reference)")
    parser.add_argument("--data", type=Path, default=REPO_ROOT / ".." / "shared" / "data" / "rm-bench")
    parser.add_argument("--per-domain", type=int, default=5, help="groups per domain (default 5)")
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--machine", default=f"cpu{len(os.sched_getaffinity(0))}")
    args = parser.parse_args(argv)

    from testkit.dpo_reference import reference_group_scores
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rmserve.client.score_file import read_scores
    from rmserve.datasets import load_rmbench

    records = {r.key: r for r in read_scores(args.scores).records}
    kinds = {(r.kind, r.mode, r.compat) for r in records.values()}
    if len(kinds) != 1 or next(iter(kinds))[0] != "dpo":
        raise SystemExit(f"{args.scores}: expected the records of one DPO run, found kinds {sorted(map(str, kinds))}")
    _, mode, compat = next(iter(kinds))
    if (mode == "reference") != (args.ref_model is not None):
        raise SystemExit(f"--ref-model: the run's mode is {mode!r}; give the reference exactly when the mode is reference")
    dataset = load_rmbench(args.data)
    by_domain: dict[str, list] = {}
    for group in dataset.groups:
        by_domain.setdefault(group.domain, []).append(group)
    picked = [g for groups in by_domain.values() for i in spread(len(groups), args.per_domain) for g in [groups[i]]]

    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    policy = AutoModelForCausalLM.from_pretrained(args.policy).float().eval()
    reference = None if args.ref_model is None else AutoModelForCausalLM.from_pretrained(args.ref_model).float().eval()
    rows, worst = [], 0.0
    for group in picked:
        record = records.get(group.key)
        if record is None:
            raise SystemExit(f"{args.scores}: group {group.key} is not in the score file")
        messages = [{"role": m.role, "content": m.content} for m in group.messages]
        expected = [s.rewards[mode] for s in reference_group_scores(
            policy, reference, tokenizer, messages, list(group.responses), compat=compat)]
        diffs = [abs(float(got) - want) for got, want in zip(record.rewards, expected, strict=True)]
        worst = max(worst, *diffs)
        rows.append({"domain": group.domain, "id": group.id, "max_abs_diff": max(diffs),
                     "rewards": list(record.rewards), "reference": expected,
                     "answer_tokens": list(record.extras.get("answer_tokens", ())) if record.extras else []})
    ok = worst <= args.atol
    report = {
        "benchmark": "dpo-parity", "date": dt.date.today().isoformat(), "scores": str(args.scores),
        "policy": args.policy, "ref_model": args.ref_model, "mode": mode, "compat": compat,
        "groups": len(rows), "responses": sum(len(r["rewards"]) for r in rows),
        "max_abs_diff": worst, "atol": args.atol, "ok": ok, "rows": rows,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    lines = [
        f"# DPO reward parity — {report['date']} — {args.machine}", "",
        f"Run `{args.scores}` (mode {mode}, compat {compat}); policy `{args.policy}`"
        + (f", reference `{args.ref_model}`" if args.ref_model else "") + ".",
        f"{len(rows)} groups ({args.per_domain} per domain, spread evenly), {report['responses']} responses: "
        f"max |rmserve − transformers reference| = {worst:.2e} (atol {args.atol:g}): {'OK' if ok else 'FAILED'}.", "",
        "| domain | id | answer tokens | max abs diff |", "| --- | --- | --- | ---: |",
        *[f"| {r['domain']} | {r['id']} | {', '.join(map(str, r['answer_tokens']))} | {r['max_abs_diff']:.2e} |" for r in rows],
        "", f"Command: `{report['command']}`",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{report['date']}-{args.machine}-dpo-parity"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
