"""The exit statuses every ``rankecho`` command uses, defined once (docs/cli.md tabulates them).

A script driving rankecho can rely on them across commands: 0 means the command did what it was asked
(and, for runs that ship data, that every point was acknowledged); anything else means it did not.
"""

from __future__ import annotations

OK = 0
"""Done; for commands that ship data (sim, agent, stress): every point was acknowledged."""
FAILED = 1
"""The work failed or lost data (named on stderr with the fix)."""
USAGE = 2
"""Bad usage or bad input: a flag, a file, a scenario, a store that is not one (nothing was changed)."""
STORE_HELD = 3
"""The store is held by another process (a running Echo): stop it or read through it (--mcp-url)."""
INTERRUPTED = 130
"""Stopped by Ctrl-C before the work finished."""
BROKEN_PIPE = 141
"""The reader of stdout went away (``rankecho diagnose | head``): 128 + SIGPIPE, as the shell reports a
tool killed by a broken pipe; no traceback is printed."""
