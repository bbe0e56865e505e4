"""Text and Mermaid views of a topology, and the `pystreams topology` command."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pystreams.topology.describe import describe, to_mermaid
from pystreams.topology.ir import stores_of
from pystreams.topology.resolve import resolve

from pystreams.app import load_app
from pystreams.commands import topology as topology_command

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXAMPLE_NAMES = ["wordcount", "clicks_windowed", "orders_enrich_join", "dedupe_processor"]


def example(name: str):
    return load_app(str(EXAMPLES / f"{name}.py")).topology()


def test_text_lists_subtopologies_tasks_stores_and_topics():
    topology = example("wordcount")
    text = describe(topology)
    assert f"Topology wordcount (hash {topology.hash})" in text
    assert "Sub-topology 0" in text and "Sub-topology 1" in text and "Sub-topology 2" not in text
    assert "N = max partitions of ['text-lines']" in text
    assert "Sink: words-repartition-sink (topic 'wordcount-words-repartition')" in text
    assert "wordcount-counts-changelog: changelog of store counts" in text and "cleanup.policy=compact" in text
    resolved_text = describe(topology, resolve(topology, {"text-lines": 2}))
    assert "tasks (2): 1_0, 1_1" in resolved_text and "wordcount-words-repartition: repartition" in resolved_text
    assert "2 partitions" in resolved_text


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_mermaid_is_a_flowchart_with_every_node_and_topic(name):
    topology = example(name)
    chart = to_mermaid(topology)
    lines = chart.splitlines()
    assert lines[0] == "flowchart LR"
    declared_ids = {m.group(1) for m in re.finditer(r"^\s+(n_\w+)[\[(]", chart, re.M)}
    assert len(declared_ids) == len(topology.nodes)
    for node in topology.nodes.values():
        assert f'"{node.name}<br/>{node.kind}"' in chart
    for topic in [*topology.external_source_topics, *topology.sink_topics, *topology.repartition_topics]:
        assert f'>"{topic}"]' in chart
    # every edge joins declared ids, and subgraphs are closed
    ids = set(re.findall(r"^\s+(\w+)[\[(>]", chart, re.M))
    edges = re.findall(r"^\s+(\w+) -[-.]-?>? (\w+)$", chart, re.M)
    assert len(edges) >= sum(len(node.children) + len(stores_of(node)) for node in topology.nodes.values())
    for left, right in edges:
        assert left in ids and right in ids
    assert sum(line.strip().startswith("subgraph") for line in lines) == len(topology.subtopologies)
    assert sum(line.strip() == "end" for line in lines) == len(topology.subtopologies)


def run_command(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    topology_command.configure(parser)
    code = topology_command.run(parser.parse_args(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_command_prints_subtopologies_tasks_and_topics(capsys):
    code, out, _ = run_command([str(EXAMPLES / "wordcount.py")], capsys)
    assert code == 0
    assert "Sub-topology 0" in out and "Sub-topology 1" in out
    assert "tasks: 1_0 .. 1_(N-1)" in out
    for topic in ("text-lines", "word-counts", "wordcount-words-repartition", "wordcount-counts-changelog"):
        assert f"  {topic}:" in out


def test_command_resolves_with_partition_counts(capsys):
    code, out, _ = run_command([str(EXAMPLES / "wordcount.py"), "--partitions", "text-lines=4"], capsys)
    assert code == 0 and "tasks (4): 0_0, 0_1, 0_2, 0_3" in out
    code, out, _ = run_command([str(EXAMPLES / "orders_enrich_join.py"), "--default-partitions", "2"], capsys)
    assert code == 0 and "tasks (2): 1_0, 1_1" in out


def test_command_mermaid(capsys):
    code, out, _ = run_command([str(EXAMPLES / "wordcount.py"), "--mermaid"], capsys)
    assert code == 0 and out.startswith("flowchart LR\n") and "n_counts" in out


def test_command_reports_errors_and_fails(capsys):
    code, out, err = run_command(
        [
            str(EXAMPLES / "orders_enrich_join.py"),
            "--partitions",
            "orders=3",
            "--partitions",
            "payments=4",
            "--partitions",
            "customers=3",
        ],
        capsys,
    )
    assert code == 1 and out == ""
    assert "error: join 'paid' needs co-partitioned inputs" in err
    code, _, err = run_command([str(EXAMPLES / "wordcount.py"), "--partitions", "text-lines"], capsys)
    assert code == 1 and "TOPIC=N" in err


def test_command_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "pystreams.commands.topology", "examples/wordcount.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Topology wordcount (hash ")
