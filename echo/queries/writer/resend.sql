-- The writer's resend check (echo/store/resend.py): which ids of a commit's rows are stored already.
-- A resend carries the same ids at the same times, so it is looked for only among the rows stored in the
-- commit's own time range [$low_ns, $high_ns] (each table's time order lets DuckDB skip the other row
-- groups); a typed-only event's time is its enter (collectives) or start (host_activity; the 'runq' rows
-- are the second piece of an off-CPU event, not an event). The relation `incoming` holds the commit's ids.

-- name: stored_ids
SELECT DISTINCT i.event_id FROM incoming i
WHERE i.event_id IN (
    SELECT event_id FROM events_generic WHERE timestamp_ns BETWEEN $low_ns AND $high_ns
    UNION ALL SELECT event_id FROM collectives WHERE enter_ns BETWEEN $low_ns AND $high_ns AND NOT in_generic
    UNION ALL SELECT event_id FROM host_activity
              WHERE start_ns BETWEEN $low_ns AND $high_ns AND NOT in_generic AND kind <> 'runq'
);
