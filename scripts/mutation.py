"""``make mutation``: mutmut over the code where a silent bug costs data or security, each with its tests.

Each target runs in its own copy of the working tree (tracked and untracked, not ignored, files) with a
``[tool.mutmut]`` section written for that target only, so one target's tests never run for another's
mutants and nothing of mutmut's lands in the checkout. A target stops after ``--budget-s`` seconds
(mutmut remembers finished mutants in the copy; the report counts what finished).

Usage::

    python scripts/mutation.py                       # every target (tens of minutes: not part of make test)
    python scripts/mutation.py health chain event_id --budget-s 600 --report build/mutation.json
    python scripts/mutation.py --list
    python scripts/mutation.py guard --only 'echo.guard.parsed.x_serialize__mutmut_*'   # some mutants only

Scores and surviving mutants with their reasons are kept in docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Target:
    files: tuple[str, ...]
    """Source files whose functions are mutated."""
    tests: tuple[str, ...]
    """The test files that cover them (the only tests mutmut runs for this target)."""
    why: str
    functions: tuple[str, ...] = ()
    """Mutant-name globs (``module.x_function__mutmut_*``, methods ``module.xǁClassǁmethod__mutmut_*``)
    when only some functions of the files are the target; empty: every function."""


TRACKER = "agent.tracker.xǁTrackerǁ"
COLLECTIVES = "agent.collectives.xǁCollectivesǁ"
TARGETS: dict[str, Target] = {
    "health": Target(("agent/health.py",), ("tests/test_agent_health.py", "tests/test_agent_tracker.py"),
                     "the per-rank health score (docs/health.md)"),
    "event_id": Target(
        ("agent/identity.py", "agent/tracker.py", "shared/contract.py"),
        ("tests/test_agent_tracker.py", "tests/test_agent_chain.py", "tests/test_compact_store.py"),
        "event ids (contract.event_id, which Echo recomputes from a typed row, or short_hash, over node, "
        "process, metric, thread, time, chain) and the comm-id hashes",
        ("agent.identity.x_short_hash__*", "agent.identity.x_unique_id_hash__*",
         "agent.identity.x_split_child_id__*", "agent.identity.x_unaligned_comm_id__*", f"{TRACKER}emit__*",
         "shared.contract.x_event_id__*"),
    ),
    "chain": Target(
        ("agent/collectives.py", "agent/procstate.py"),
        ("tests/test_agent_tracker.py", "tests/test_agent_chain.py", "tests/test_agent_health.py",
         "tests/test_agent_journal.py", "tests/test_agent_window.py", "tests/test_agent_stacks_keeper.py"),
        "which comm and sequence number each point's causal chain id is built from (shared.contract's "
        "causal_chain_id itself is one f-string, which mutmut does not mutate)",
        (f"{COLLECTIVES}collective__*", f"{COLLECTIVES}comm_init__*", f"{COLLECTIVES}_comm__*",
         f"{COLLECTIVES}_step_done__*", f"{COLLECTIVES}sync__*", "agent.procstate.xǁProcǁstep_chain__*"),
    ),
    "guard": Target(("echo/guard/*.py",), ("tests/test_guard_units.py", "tests/test_guard_bound.py",
                                           "tests/test_guard_layers.py", "tests/test_guard_corpus.py",
                                           "tests/test_guard_parsed.py", "tests/test_guard_fuzz.py"),
                    "the SQL guard's token, parser and binder layers, the allowed catalog and the sealed "
                    "instance"),
    # test_writer_paths.py first: direct and fast (about 15 s), it kills most mutants before the slow
    # end-to-end files run (mutmut stops at a mutant's first failing test).
    "writer": Target(("echo/store/writer.py",),
                     ("tests/test_writer_paths.py", "tests/test_echo_writer.py", "tests/test_store_faults.py",
                      "tests/test_durability.py", "tests/test_echo_serve.py"),
                     "the single writer: commit before acknowledge, duplicates, isolation of bad requests, "
                     "what a failed commit reports, checkpoints and probes at idle"),
    "store": Target(("echo/store/resend.py", "echo/store/staging.py", "echo/store/typed_events.py"),
                    ("tests/test_compact_store.py", "tests/test_writer_paths.py",
                     "tests/test_analysis_staging.py"),
                    "what a commit stores: resends found by id in the commit's time range, each event once "
                    "(typed only when it rebuilds exactly, else as sent), ids stored only when not computed"),
}


@dataclass
class Outcome:
    target: str
    status: str
    """``finished``, ``budget`` (stopped at the time budget) or ``error``."""
    seconds: float
    counts: dict[str, int]
    survived: list[str]
    score: float | None
    """killed / (killed + survived + timeouts), over the mutants that finished."""


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, ignored files left out)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_symlink() and src.is_dir():  # rankecho/echo -> ../echo: a real copy, mutated in place
            shutil.copytree(src.resolve(), dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to(os.readlink(src))
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


PACKAGE = "rankecho"
"""The one import namespace: the tests import ``rankecho.agent...``, so mutmut mutates the files under
``rankecho/`` (materialised copies of the symlinked trees) and names mutants ``rankecho.<module>...``;
mutating ``agent/`` itself would name them ``agent.<module>``, which no test calls."""


def in_package(name: str) -> str:
    """A target's file path or mutant glob as seen through :data:`PACKAGE`."""
    sep = "/" if "/" in name else "."
    return name if name.startswith(PACKAGE + sep) else f"{PACKAGE}{sep}{name}"


def configure(dest: Path, target: Target) -> None:
    others = sorted(p.name for p in ROOT.iterdir()
                    if p.is_dir() and (p / "__init__.py").exists() and p.name != PACKAGE)
    section = "\n".join([
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps([PACKAGE])}",
        f"only_mutate = {json.dumps([in_package(f) for f in target.files])}",
        f"also_copy = {json.dumps([*others, 'sim', 'docs', 'scripts', 'tests'])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(target.tests))}",
        'pytest_add_cli_args = ["-q", "-p", "no:cacheprovider"]',
        "",
    ])
    pyproject = dest / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + section)


RESULT = re.compile(r"^\s*(\S+): (\w[\w ]*)$")


def results(workdir: Path, functions: tuple[str, ...]) -> dict[str, str]:
    """mutant name -> status, from ``mutmut results --all true``, of the target's functions only."""
    out = subprocess.run([mutmut_bin(), "results", "--all", "true"], cwd=workdir, capture_output=True,
                         text=True).stdout
    found = {m.group(1): m.group(2) for line in out.splitlines() if (m := RESULT.match(line))}
    globs = [in_package(f) for f in functions]
    return {k: v for k, v in found.items() if not globs or any(fnmatch(k, g) for g in globs)}


def mutmut_bin() -> str:
    return str(Path(sys.executable).with_name("mutmut"))


def run_target(name: str, target: Target, budget_s: float, children: int, keep: Path | None) -> Outcome:
    workdir = Path(tempfile.mkdtemp(prefix=f"rankecho-mutation-{name}-"))
    started = time.monotonic()
    status = "finished"
    try:
        copy_tree(workdir)
        configure(workdir, target)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        log = (keep or workdir) / f"mutmut-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            cmd = [mutmut_bin(), "run", "--max-children", str(children), *map(in_package, target.functions)]
            proc = subprocess.Popen(cmd, cwd=workdir,
                                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=budget_s)
                status = "finished" if code == 0 else "error"
                if "could not find any test case" in log.read_text(errors="replace"):
                    status = "no covered mutants"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 15)
                proc.wait(30)
                status = "budget"
        by_mutant = results(workdir, target.functions)
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"{name}: mutmut's copy kept in {workdir}", flush=True)
    counts: dict[str, int] = {}
    for state in by_mutant.values():
        counts[state] = counts.get(state, 0) + 1
    killed = counts.get("killed", 0)
    judged = killed + counts.get("survived", 0) + counts.get("timeout", 0)
    survived = sorted(m for m, s in by_mutant.items() if s == "survived")
    return Outcome(name, status, round(time.monotonic() - started, 1), counts, survived,
                   round(killed / judged, 4) if judged else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/mutation.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help=f"default: all of {list(TARGETS)}")
    parser.add_argument("--budget-s", type=float, default=900.0, help="time limit per target")
    parser.add_argument("--max-children", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--report", type=Path, help="write the outcomes as JSON")
    parser.add_argument("--keep", type=Path, help="keep mutmut's copies and logs (for mutmut show)")
    parser.add_argument("--list", action="store_true", help="print the targets and exit")
    parser.add_argument("--only", action="append", default=[], metavar="GLOB",
                        help="run only the mutants whose names match (repeatable; e.g. last run's survivors)")
    args = parser.parse_args(argv)
    if args.list:
        for name, t in TARGETS.items():
            print(f"{name:<9} {', '.join(t.files)}  <- {', '.join(t.tests)}  ({t.why})")
        return 0
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s) {unknown}; available: {list(TARGETS)}")
    if not Path(mutmut_bin()).exists():
        parser.error("mutmut is not installed in this environment: pip install -e '.[dev]' (make install)")
    outcomes = []
    for name in args.targets or list(TARGETS):
        target = TARGETS[name]
        if args.only:
            target = replace(target, functions=tuple(args.only))
        o = run_target(name, target, args.budget_s, args.max_children, args.keep)
        outcomes.append(o)
        score = "n/a" if o.score is None else f"{o.score:.1%}"
        print(f"{name}: {o.status} in {o.seconds:.0f} s, score {score}, {o.counts}", flush=True)
        for mutant in o.survived:
            print(f"  survived: {mutant}")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 0 if all(o.status != "error" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
