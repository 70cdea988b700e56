"""The diagnosis scored end to end on the whole scenario set (sim/scenarios/diagnosis): real rank
processes, one real eBPF agent per node, a real Echo, find_stragglers against ground truth. Prints the
score table (the one docs/analysis.md shows) and holds the set to the targets of rankecho.evaluate:
precision and recall of late episodes >= 0.95, causes right >= 90%, every period exact, nobody named
on a healthy scenario."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_agent_helpers import requires_ebpf, sim_built

from rankecho.evaluate import SCENARIO_SET, evaluate, markdown, pooled, verdicts

pytestmark = [requires_ebpf, pytest.mark.ebpf, pytest.mark.slow, pytest.mark.timeout(2400)]


def test_the_scenario_set_meets_the_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_built()
    paths = sorted(SCENARIO_SET.glob("*.yaml"))
    results = [evaluate(path, tmp_path / path.stem) for path in paths]
    with capsys.disabled():
        print("\n" + markdown(results))
    total = pooled(results)
    assert total.true_positives > 300, "the set should hold hundreds of late episodes"
    assert verdicts(results) == [], markdown(results)
