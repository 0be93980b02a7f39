"""The metrics stage must import without torch or vllm."""

from __future__ import annotations

import subprocess
import sys


def test_metrics_import_stays_light():
    code = (
        "import sys\n"
        "import rmserve.metrics, rmserve.metrics.evaluation, rmserve.metrics.comparison, rmserve.metrics.render_json,"
        " rmserve.metrics.render_markdown, rmserve.metrics.figures, rmserve.metrics.outputs,"
        " rmserve.metrics.scores, rmserve.metrics.score_files, rmserve.cli_metrics\n"
        "heavy = [m for m in ('torch', 'vllm', 'transformers', 'matplotlib') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout.strip()}"
