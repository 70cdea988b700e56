"""Which rows of a commit are new: a resent event is stored once, without an index over every event id.

Producers resend whole requests (a lost acknowledgement, the agent's spool replayed after a restart, an
SDK's retry) with the same ids and times, so a resent event is looked for only among the rows stored in
the commit's own time range (the named query ``stored_ids``, ``echo/queries/writer/``). An index over
every event id would live in memory (~49 B an id) and grow with the store; this lookup reads the few row
groups of that time range.

Usage::

    new = fresh_events(con, table)   # inside the writer's transaction, before storing ``new``
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from rankecho.echo.queries import WRITER


def fresh_events(con: duckdb.DuckDBPyConnection, table: pa.Table) -> pa.Table:
    """The rows of ``table`` whose event id is not stored yet, each id once (the first row with it)."""
    bounds = pc.min_max(table["timestamp_ns"])
    query = WRITER["stored_ids"]
    span = query.bind(low_ns=bounds["min"].as_py(), high_ns=bounds["max"].as_py())
    con.register("incoming", table.select(["event_id", "timestamp_ns"]))
    # No try/finally: after a failed statement the transaction refuses even unregistering, which would
    # hide the failure's cause; the next commit's registration replaces this one.
    found = [row[0] for row in con.execute(query.sql, span).fetchall()]
    con.unregister("incoming")
    ids = table["event_id"]
    if found:
        table = table.filter(pc.invert(pc.is_in(ids, value_set=pa.array(found, pa.string()))))
        ids = table["event_id"]
    if pc.count_distinct(ids).as_py() < table.num_rows:  # the same event twice in one commit
        seen: set[str] = set()
        first = []
        for i, event_id in enumerate(ids.to_pylist()):
            if event_id not in seen:
                seen.add(event_id)
                first.append(i)
        table = table.take(pa.array(first, pa.int64()))
    return table
