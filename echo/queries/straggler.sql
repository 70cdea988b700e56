-- The straggler investigation, as example queries served to agents in the schema resource
-- (rankecho://schema) and run by the straggler demo. Each needs only the node agent's events:
-- rankecho.nccl.collective (one row per collective per rank, timestamp = enter), rankecho.health.score
-- (one per step per rank, carrying the step's causal_chain_id) and the per-call/per-thread events.
-- A collective counts as "late" when the last rank entered >= 100 ms after the first.

-- name: example_late_ranks
-- Which rank entered collectives last, how often and by how much: per (node, rank), the complete
-- collective instances (every rank reported) whose last entrant it was, with a spread >= 100 ms.
WITH per_chain AS (
    SELECT causal_chain_id,
           arg_max(node_id, timestamp_ns) AS last_node,
           arg_max(rank, timestamp_ns) AS last_rank,
           (max(timestamp_ns) - min(timestamp_ns)) / 1e6 AS late_ms
    FROM events
    WHERE metric_name = 'rankecho.nccl.collective' AND causal_chain_id IS NOT NULL
    GROUP BY causal_chain_id
    HAVING count(*) = max(nranks)
)
SELECT last_node AS node_id, last_rank AS rank, count(*) AS late_collectives,
       round(median(late_ms), 1) AS median_late_ms, round(max(late_ms), 1) AS max_late_ms
FROM per_chain
WHERE late_ms >= 100
GROUP BY last_node, last_rank
ORDER BY late_collectives DESC;

-- name: example_late_steps
-- At which training steps each late rank held the others back, and the period: step numbers count
-- that rank's health-score events (one per step); a late collective belongs to the step whose first
-- collective (the health event's causal_chain_id) is the latest at or before it on the same communicator.
WITH late_chains AS (
    SELECT causal_chain_id,
           arg_max(node_id, timestamp_ns) AS node_id,
           arg_max(rank, timestamp_ns) AS rank
    FROM events
    WHERE metric_name = 'rankecho.nccl.collective' AND causal_chain_id IS NOT NULL
    GROUP BY causal_chain_id
    HAVING count(*) = max(nranks) AND max(timestamp_ns) - min(timestamp_ns) >= 100000000
),
steps AS (
    SELECT node_id, rank,
           split_part(causal_chain_id, ':', 1) AS comm,
           TRY_CAST(split_part(causal_chain_id, ':', 2) AS BIGINT) AS first_seq,
           row_number() OVER (PARTITION BY node_id, rank ORDER BY timestamp_ns) AS step
    FROM events
    WHERE metric_name = 'rankecho.health.score' AND causal_chain_id IS NOT NULL
),
late_steps AS (
    SELECT DISTINCT c.node_id, c.rank,
           (SELECT max(s.step) FROM steps s
            WHERE s.node_id = c.node_id AND s.rank = c.rank
              AND s.comm = split_part(c.causal_chain_id, ':', 1)
              AND s.first_seq <= TRY_CAST(split_part(c.causal_chain_id, ':', 2) AS BIGINT)) AS step
    FROM late_chains c
)
SELECT node_id, rank, count(*) AS late_steps, median(gap) AS every_n_steps,
       list(step ORDER BY step) AS steps
FROM (
    SELECT *, step - lag(step) OVER (PARTITION BY node_id, rank ORDER BY step) AS gap
    FROM late_steps
    WHERE step IS NOT NULL
)
GROUP BY node_id, rank
ORDER BY late_steps DESC;

-- name: example_before_late_entry
-- What each late rank's calling thread did in the 500 ms before it entered a late collective (one
-- window per late episode): CUDA calls by name, off-CPU time by state and the call in flight.
WITH late_chains AS (
    SELECT arg_max(node_id, timestamp_ns) AS node_id,
           arg_max(rank, timestamp_ns) AS rank,
           arg_max(json_extract_string(attrs_json, '$."thread.id"'), timestamp_ns) AS tid,
           max(timestamp_ns) AS entered_ns
    FROM events
    WHERE metric_name = 'rankecho.nccl.collective' AND causal_chain_id IS NOT NULL
    GROUP BY causal_chain_id
    HAVING count(*) = max(nranks) AND max(timestamp_ns) - min(timestamp_ns) >= 100000000
),
late_entries AS (
    SELECT * FROM (
        SELECT *,
               entered_ns - lag(entered_ns) OVER (PARTITION BY node_id, rank ORDER BY entered_ns) AS since_prev
        FROM late_chains
    )
    WHERE since_prev IS NULL OR since_prev > 500000000
)
SELECT l.node_id, l.rank, e.metric_name,
       coalesce(json_extract_string(e.attrs_json, '$."rankecho.cuda.call"'),
                json_extract_string(e.attrs_json, '$."rankecho.sched.state"') || ' in '
                || coalesce(nullif(json_extract_string(e.attrs_json, '$."rankecho.call_in_flight"'), ''), 'host code'),
                '') AS activity,
       count(DISTINCT l.entered_ns) AS windows,
       count(*) AS events,
       round(sum(e.value_double), 1) AS total_ms
FROM late_entries l
JOIN events e
  ON e.node_id = l.node_id AND e.rank = l.rank
 AND json_extract_string(e.attrs_json, '$."thread.id"') = l.tid
 AND e.timestamp_ns BETWEEN l.entered_ns - 500000000 AND l.entered_ns
 AND e.metric_name NOT IN ('rankecho.nccl.collective', 'rankecho.health.score', 'rankecho.cuda.kernel_launches')
GROUP BY ALL
ORDER BY total_ms DESC NULLS LAST
LIMIT 10;
