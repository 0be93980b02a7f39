"""``rmserve metrics …``: benchmark figures from score files.

Each command parses its options into a :class:`rmserve.metrics.evaluation.MetricsConfig`, calls
one library function and renders the result (Markdown on stdout, or JSON with ``--json``).
Score records of a generative judge are evaluated from their verdicts, with parse-failure
rates in the tables (:mod:`rmserve.metrics.judge`); records of different kinds of score in
one score set are bad input.

Exit codes follow :mod:`rmserve.cli_common`: a :class:`rmserve.errors.DataError` in the score
files ends the command with exit code 2 and one line on stderr naming file, line and field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import typer

from rmserve.schema import BENCHMARKS
from rmserve.cli_common import SEED_HELP, Command, bad_parameter, guarded, resamples_help, with_default

metrics_app = typer.Typer(
    help="Compute benchmark figures from score files.", no_args_is_help=True, rich_markup_mode=None
)

T = TypeVar("T")

RMBenchFilesArg = Annotated[
    list[Path],
    typer.Argument(
        metavar="FILE",
        help="RM-Bench score files: rmserve score JSONL or the official RM-Bench result JSON (format detected; "
        "several files are concatenated). A generative judge's score records give figures from its verdicts, "
        "with parse-failure rates.",
        show_default=False,
    ),
]
RB2FilesArg = Annotated[
    list[Path],
    typer.Argument(
        metavar="FILE",
        help="RewardBench 2 score files: rmserve score JSONL or the official per-item JSONL (format detected; "
        "several files are concatenated). A generative judge's score records give figures from its verdicts, "
        "with parse-failure rates.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the JSON result only.")]
RMBenchOutOpt = Annotated[
    Path | None,
    typer.Option("--out", metavar="DIR", help="Folder for results.json, table.md and the heatmap PNGs.",
                 show_default=False),
]
RB2OutOpt = Annotated[
    Path | None,
    typer.Option("--out", metavar="DIR", help="Folder for results.json and table.md.", show_default=False),
]
ResamplesOpt = Annotated[int, typer.Option("--resamples", help=resamples_help(0))]
SeedOpt = Annotated[int, typer.Option("--seed", help=SEED_HELP)]
ConfidenceOpt = Annotated[
    float, typer.Option("--confidence", metavar="FRACTION", help="Interval coverage, in (0, 1).")
]
RMBENCH_DOMAIN_CHOICES = ("chat", "math", "code", "safety-refuse", "safety-response")
"""``--domain`` values: :data:`rmserve.schema.RMBENCH_DOMAINS` (spelled out: the CLI imports no metrics code)."""
DPO_REWARD_CHOICES = ("avg", "sum", "norm", "reference")
"""``--dpo-reward`` values: :data:`rmserve.metrics.dpo.DPO_REWARDS`."""
DomainOpt = Annotated[
    Literal[RMBENCH_DOMAIN_CHOICES] | None,  # type: ignore[valid-type]
    typer.Option(
        "--domain",
        help=with_default(
            "RM-Bench domain of result records without a 'domain' field.", "from the file name, <domain>_filtered.json"
        ),
        show_default=False,
    ),
]
DpoRewardOpt = Annotated[
    Literal[DPO_REWARD_CHOICES] | None,  # type: ignore[valid-type]
    typer.Option(
        "--dpo-reward",
        help="Recompute a DPO run's rewards from its score records' extras instead of using the rewards as scored: "
        "avg (policy_logp / answer_tokens), sum (policy_logp), norm (-policy_logp_norm) or reference "
        "(policy_logp - ref_logp).",
        show_default=False,
    ),
]
RewardExtraOpt = Annotated[
    str | None,
    typer.Option(
        "--reward-extra",
        metavar="NAME",
        help="Use each response's extras NAME from rmserve score records as its reward instead of the rewards as "
        "scored: one objective of a multi-objective head (objective_0, objective_1 and so on, which the remote-code "
        "head keeps). Not with --dpo-reward.",
        show_default=False,
    ),
]
BenchOpt = Annotated[
    Literal["rm-bench", "rewardbench2"] | None,
    typer.Option("--bench", help=with_default("Expected benchmark.", "detected"), show_default=False),
]


def _config(**kwargs):
    from rmserve.metrics.evaluation import MetricsConfig

    return bad_parameter(lambda: MetricsConfig(**kwargs))


def _guard(call: Callable[[], T]) -> T:
    """Run ``call`` under the one exit-code rule: bad data in the score files is one stderr
    line and exit code 2 (the files are the user's input); Ctrl-C is 130."""
    return guarded(call, with_type=False)


def _emit(evaluation, as_json: bool, out: Path | None) -> None:
    from rmserve.metrics.outputs import write_outputs
    from rmserve.metrics.render_json import result_dict, to_json
    from rmserve.metrics.render_markdown import render_markdown

    if out is not None:
        try:
            write_outputs(evaluation, out)
        except OSError as exc:
            typer.echo(f"error: cannot write to {out}: {exc.strerror or exc}", err=True)
            raise typer.Exit(1) from None
    typer.echo(to_json(result_dict(evaluation)) if as_json else render_markdown(evaluation), nl=as_json)


@metrics_app.command("rm-bench", cls=Command, short_help="RM-Bench accuracy table of score files.")
def rm_bench(
    files: RMBenchFilesArg,
    as_json: JsonOpt = False,
    out: RMBenchOutOpt = None,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    domain: DomainOpt = None,
    dpo_reward: DpoRewardOpt = None,
    reward_extra: RewardExtraOpt = None,
) -> None:
    """RM-Bench accuracy: Chat | Math | Code | Safety | Easy | Normal | Hard | Avg."""
    from rmserve.metrics.evaluation import evaluate_files

    config = _config(
        resamples=resamples, seed=seed, confidence=confidence, domain=domain, benchmark="rm-bench", dpo_reward=dpo_reward,
        reward_extra=reward_extra,
    )
    _emit(_guard(lambda: evaluate_files(files, config)), as_json, out)


@metrics_app.command("rewardbench2", cls=Command, short_help="RewardBench 2 score table of score files.")
def rewardbench2(
    files: RB2FilesArg,
    as_json: JsonOpt = False,
    out: RB2OutOpt = None,
    resamples: ResamplesOpt = 1000,
    seed: SeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    dpo_reward: DpoRewardOpt = None,
    reward_extra: RewardExtraOpt = None,
) -> None:
    """RewardBench 2 scores: Factuality | Precise IF | Math | Safety | Focus | Ties | Avg."""
    from rmserve.metrics.evaluation import evaluate_files

    config = _config(
        resamples=resamples, seed=seed, confidence=confidence, benchmark="rewardbench2", dpo_reward=dpo_reward,
        reward_extra=reward_extra,
    )
    _emit(_guard(lambda: evaluate_files(files, config)), as_json, out)


@metrics_app.command("compare", cls=Command, short_help="Paired difference B − A of two score files.")
def compare(
    file_a: Annotated[
        Path, typer.Argument(metavar="FILE_A", help="Score file of A (the baseline).", show_default=False)
    ],
    file_b: Annotated[
        Path, typer.Argument(metavar="FILE_B", help="Score file of B (compared against A).", show_default=False)
    ],
    bench: BenchOpt = None,
    as_json: JsonOpt = False,
    resamples: Annotated[int, typer.Option("--resamples", help=resamples_help(1))] = 1000,
    seed: SeedOpt = 0,
    confidence: ConfidenceOpt = 0.95,
    domain: DomainOpt = None,
    dpo_reward: DpoRewardOpt = None,
    reward_extra: RewardExtraOpt = None,
) -> None:
    """Paired difference B − A per figure over the same groups, with its bootstrap interval."""
    from rmserve.metrics.comparison import compare_files
    from rmserve.metrics.render_json import comparison_dict, to_json
    from rmserve.metrics.render_markdown import render_comparison

    if bench is not None and bench not in BENCHMARKS:
        raise typer.BadParameter(f"{bench!r} is not one of {', '.join(map(repr, BENCHMARKS))}.", param_hint="'--bench'")
    if resamples < 1:
        raise typer.BadParameter(
            f"must be at least 1 for a comparison (the paired differences need intervals), got {resamples}",
            param_hint="'--resamples'",
        )
    config = _config(
        resamples=resamples, seed=seed, confidence=confidence, domain=domain, benchmark=bench, dpo_reward=dpo_reward,
        reward_extra=reward_extra,
    )
    comparison = _guard(lambda: compare_files(file_a, file_b, config))
    typer.echo(to_json(comparison_dict(comparison)) if as_json else render_comparison(comparison), nl=as_json)
