-- Named queries behind the MCP investigation tools. Each runs unchanged in the duckdb CLI once its
-- $parameters are bound; a NULL window bound ($start_ns / $end_ns) means "unbounded on that side",
-- a NULL filter means "any". Every statement passes the same SQL guard as a caller's query.

-- name: window_anchor
-- The newest event time and the start of its UTC day (ns): "last 5m" and "14:30-14:35" are resolved
-- against these, so an offline store answers the same as a live one.
SELECT max(timestamp_ns) AS latest_ns,
       (max(timestamp_ns) // 86400000000000) * 86400000000000 AS latest_day_ns
FROM events;

-- name: summary_totals
-- One row: events, clusters, nodes, ranks (distinct cluster/node/rank triples), metrics, time range.
SELECT count(*) AS events,
       count(DISTINCT cluster_id) AS clusters,
       count(DISTINCT node_id) AS nodes,
       count(DISTINCT (cluster_id, node_id, rank)) FILTER (WHERE rank IS NOT NULL) AS ranks,
       count(DISTINCT metric_name) AS metrics,
       min(timestamp_ns) AS first_ns,
       max(timestamp_ns) AS last_ns
FROM events
WHERE ($start_ns IS NULL OR timestamp_ns >= $start_ns)
  AND ($end_ns IS NULL OR timestamp_ns < $end_ns);

-- name: summary_nodes
-- Per node: events, ranks seen, first/last event, and staleness = seconds from the node's last event to
-- $now_ns (Echo's clock) and to the newest event of any node (a stalled node lags its peers).
WITH w AS (
    SELECT cluster_id, node_id, rank, timestamp_ns
    FROM events
    WHERE ($start_ns IS NULL OR timestamp_ns >= $start_ns)
      AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
)
SELECT cluster_id,
       node_id,
       count(*) AS events,
       list(DISTINCT rank ORDER BY rank) FILTER (WHERE rank IS NOT NULL) AS ranks,
       min(timestamp_ns) AS first_ns,
       max(timestamp_ns) AS last_ns,
       ($now_ns - max(timestamp_ns)) / 1e9 AS stale_s,
       (max(max(timestamp_ns)) OVER () - max(timestamp_ns)) / 1e9 AS behind_newest_s
FROM w
GROUP BY cluster_id, node_id
ORDER BY cluster_id, node_id
LIMIT $max_rows;

-- name: summary_ranks
-- Per (cluster, node, rank): events and last event, and how far that rank's last event lags the newest
-- event of any rank (a rank stuck in a collective stops reporting while its peers go on).
SELECT cluster_id,
       node_id,
       rank,
       count(*) AS events,
       max(timestamp_ns) AS last_ns,
       (max(max(timestamp_ns)) OVER () - max(timestamp_ns)) / 1e9 AS behind_newest_s
FROM events
WHERE rank IS NOT NULL
  AND ($start_ns IS NULL OR timestamp_ns >= $start_ns)
  AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
GROUP BY cluster_id, node_id, rank
ORDER BY behind_newest_s DESC, cluster_id, node_id, rank
LIMIT $max_rows;

-- name: summary_spools
-- Per node whose agent's latest spool report is not empty: points still waiting on that node (Echo was
-- unreachable, or they are being replayed) and the age of the oldest, as of that report.
WITH reports AS (
    SELECT cluster_id, node_id, metric_name,
           arg_max(coalesce(value_double, value_int), timestamp_ns) AS value,
           max(timestamp_ns) AS reported_ns
    FROM events
    WHERE metric_name IN ('rankecho.agent.spool.points', 'rankecho.agent.spool.age_s')
      AND ($start_ns IS NULL OR timestamp_ns >= $start_ns)
      AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
    GROUP BY cluster_id, node_id, metric_name
)
SELECT cluster_id,
       node_id,
       CAST(max(value) FILTER (WHERE metric_name = 'rankecho.agent.spool.points') AS BIGINT) AS spooled_points,
       max(value) FILTER (WHERE metric_name = 'rankecho.agent.spool.age_s') AS oldest_age_s,
       max(reported_ns) AS reported_ns
FROM reports
GROUP BY cluster_id, node_id
HAVING spooled_points > 0
ORDER BY spooled_points DESC, cluster_id, node_id
LIMIT $max_rows;

-- name: summary_metrics
-- Per metric (and signal): events, nodes reporting it, time range.
SELECT metric_name,
       signal,
       count(*) AS events,
       count(DISTINCT node_id) AS nodes,
       min(timestamp_ns) AS first_ns,
       max(timestamp_ns) AS last_ns
FROM events
WHERE ($start_ns IS NULL OR timestamp_ns >= $start_ns)
  AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
GROUP BY metric_name, signal
ORDER BY events DESC, metric_name
LIMIT $max_rows;

-- name: summary_retention
-- One row: which raw and rolled-up ranges the store holds now (raw from `events`, rollups per minute from
-- `collective_rollup`, end exclusive), the limits of the Echo that last opened it (NULL: off) and what its
-- last retention pass did. Not windowed: it describes the store.
SELECT (SELECT min(timestamp_ns) FROM events) AS raw_from_ns,
       (SELECT max(timestamp_ns) FROM events) AS raw_to_ns,
       (SELECT min(minute_ns) FROM collective_rollup) AS rollup_from_ns,
       (SELECT max(minute_ns) + 60000000000 FROM collective_rollup) AS rollup_to_ns,
       retention_s,
       max_db_bytes,
       rollup_retention_s,
       raw_cutoff_ns,
       rollup_cutoff_ns,
       last_run_ns,
       last_rows_deleted,
       used_bytes,
       raw_rows_deleted
FROM retention_state;

-- name: event_history
-- Time-ordered events matching every given filter (NULL = any), oldest first, at most $max_rows.
-- The value is value_double, else value_int; attrs_json is cut at 16385 characters (sanitize.MAX_ATTRS_CHARS + 1).
-- The rows are picked first without attrs_json, then only those are read whole: `events` rebuilds a
-- typed row's attributes as it is read, and rebuilding every match to keep $max_rows cost ~1 s per 1M.
WITH picked AS (
    SELECT event_id, timestamp_ns
    FROM events
    WHERE ($start_ns IS NULL OR timestamp_ns >= $start_ns)
      AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
      AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
      AND ($node_id IS NULL OR node_id = $node_id)
      AND ($rank IS NULL OR rank = $rank)
      AND ($metric_name IS NULL OR metric_name = $metric_name)
    ORDER BY timestamp_ns, node_id, rank, event_id
    LIMIT $max_rows
)
SELECT e.timestamp_ns,
       e.cluster_id,
       e.node_id,
       e.rank,
       e.nranks,
       e.signal,
       e.metric_name,
       coalesce(e.value_double, e.value_int) AS value,
       e.causal_chain_id,
       left(e.attrs_json, 16385) AS attrs_json  -- longer blobs come back clipped and flagged, not parsed
FROM events e
SEMI JOIN picked p ON p.event_id = e.event_id AND p.timestamp_ns = e.timestamp_ns
WHERE e.timestamp_ns BETWEEN (SELECT min(timestamp_ns) FROM picked) AND (SELECT max(timestamp_ns) FROM picked)
  AND ($cluster_id IS NULL OR e.cluster_id = $cluster_id)
  AND ($node_id IS NULL OR e.node_id = $node_id)
  AND ($rank IS NULL OR e.rank = $rank)
  AND ($metric_name IS NULL OR e.metric_name = $metric_name)
ORDER BY e.timestamp_ns, e.node_id, e.rank, e.event_id
LIMIT $max_rows;

-- name: node_outliers
-- Nodes ranked by how far below their peers they are on one metric. $method is 'threshold' (cutoff =
-- $threshold) or 'mad' (cutoff = peers' median - $threshold * MAD * 1.4826, where a node's peers are
-- every other node's events in the window; exact up to 100,000 events in the window, beyond that over a
-- repeatable reservoir sample of 100,000). Per node: count, min/median/p95, the cutoff, how many
-- events fall below it, a robust z-score of the node's median against its peers, and the lowest
-- events below the cutoff as evidence.
WITH w AS MATERIALIZED (
    SELECT cluster_id, node_id, rank, timestamp_ns, causal_chain_id,
           coalesce(value_double, value_int) AS value
    FROM events
    WHERE metric_name = $metric
      AND ($start_ns IS NULL OR timestamp_ns >= $start_ns)
      AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
      AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
      AND coalesce(value_double, value_int) IS NOT NULL
),
nodes AS (
    SELECT cluster_id, node_id,
           count(*) AS events,
           min(value) AS min_value,
           quantile_cont(value, 0.5) AS median_value,
           quantile_cont(value, 0.95) AS p95_value
    FROM w
    GROUP BY cluster_id, node_id
),
sample AS MATERIALIZED (
    SELECT cluster_id, node_id, value FROM w USING SAMPLE reservoir(100000 ROWS) REPEATABLE (7)
),
peer_median AS (
    SELECT n.cluster_id, n.node_id, quantile_cont(s.value, 0.5) AS peer_median
    FROM nodes n JOIN sample s ON (s.cluster_id, s.node_id) IS DISTINCT FROM (n.cluster_id, n.node_id)
    GROUP BY n.cluster_id, n.node_id
),
peer_mad AS (
    SELECT p.cluster_id, p.node_id, p.peer_median,
           quantile_cont(abs(s.value - p.peer_median), 0.5) AS peer_mad
    FROM peer_median p JOIN sample s ON (s.cluster_id, s.node_id) IS DISTINCT FROM (p.cluster_id, p.node_id)
    GROUP BY p.cluster_id, p.node_id, p.peer_median
),
cut AS (
    SELECT n.*, m.peer_median, m.peer_mad,
           CASE WHEN $method = 'mad' THEN m.peer_median - $threshold * m.peer_mad * 1.4826
                ELSE $threshold END AS cutoff
    FROM nodes n LEFT JOIN peer_mad m USING (cluster_id, node_id)
)
SELECT c.cluster_id,
       c.node_id,
       c.events,
       c.min_value,
       c.median_value,
       c.p95_value,
       c.peer_median,
       c.peer_mad,
       c.cutoff,
       count(w.value) FILTER (WHERE w.value < c.cutoff) AS below,
       (c.peer_median - c.median_value) / nullif(c.peer_mad * 1.4826, 0) AS robust_z,
       list({'timestamp_ns': w.timestamp_ns, 'rank': w.rank, 'value': w.value,
             'causal_chain_id': w.causal_chain_id} ORDER BY w.value, w.timestamp_ns)
           FILTER (WHERE w.value < c.cutoff)[1:$evidence] AS evidence
FROM cut c JOIN w USING (cluster_id, node_id)
GROUP BY ALL
ORDER BY below DESC, median_value, cluster_id, node_id
LIMIT $max_rows;

-- name: gpu_hours
-- Observed GPU time per (cluster, node, GPU model): each (node, rank) is one GPU, observed from its
-- first to its last event in the window; the model is the rankecho.gpu.model attribute (NULL when no
-- event of that GPU carries it). The agent's own points (rank NULL: health, spool, self-metrics) are
-- no GPU: counted, they made a 4-rank node 5 GPUs. $job_id (optional): only that job's GPUs ('' =
-- events without rankecho.job.id), NULL = every job.
-- Reads the typed tables, not the `events` view: a typed row's attributes are its attribute set's
-- (read once per set), and rebuilding every row's attrs_json to read one key cost ~1 s per 1M events.
WITH stamps AS (
    SELECT cluster_id, node_id, rank, enter_ns AS ts, attrs_id, NULL AS gpu_model
    FROM collectives
    WHERE NOT in_generic AND rank IS NOT NULL
      AND ($start_ns IS NULL OR enter_ns >= $start_ns)
      AND ($end_ns IS NULL OR enter_ns < $end_ns)
      AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
      AND ($job_id IS NULL OR job_id = $job_id)
    UNION ALL
    SELECT cluster_id, node_id, rank, start_ns, attrs_id, NULL
    FROM host_activity
    WHERE NOT in_generic AND kind <> 'runq' AND rank IS NOT NULL
      AND ($start_ns IS NULL OR start_ns >= $start_ns)
      AND ($end_ns IS NULL OR start_ns < $end_ns)
      AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
      AND ($job_id IS NULL OR job_id = $job_id)
    UNION ALL
    SELECT cluster_id, node_id, rank, timestamp_ns, NULL,
           json_extract_string(attrs_json, '$."rankecho.gpu.model"')
    FROM events_generic
    WHERE rank IS NOT NULL
      AND ($start_ns IS NULL OR timestamp_ns >= $start_ns)
      AND ($end_ns IS NULL OR timestamp_ns < $end_ns)
      AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
      AND ($job_id IS NULL OR coalesce(json_extract_string(attrs_json, '$."rankecho.job.id"'), '') = $job_id)
),
per_set AS (
    SELECT cluster_id, node_id, rank, attrs_id, max(gpu_model) AS gpu_model,
           min(ts) AS first_ns, max(ts) AS last_ns
    FROM stamps
    GROUP BY cluster_id, node_id, rank, attrs_id
),
gpus AS (
    SELECT p.cluster_id, p.node_id, p.rank,
           max(coalesce(p.gpu_model, json_extract_string(a.attrs_json, '$."rankecho.gpu.model"'))) AS gpu_model,
           (max(p.last_ns) - min(p.first_ns)) / 3.6e12 AS hours
    FROM per_set p LEFT JOIN attr_sets a ON a.attrs_id = p.attrs_id
    GROUP BY p.cluster_id, p.node_id, p.rank
)
SELECT cluster_id, node_id, gpu_model, count(*) AS gpus, sum(hours) AS gpu_hours
FROM gpus
GROUP BY cluster_id, node_id, gpu_model
ORDER BY cluster_id, node_id, gpu_model
LIMIT $max_rows;

-- name: data_coverage
-- Per cluster over the whole store: events of any kind, and the agent data the diagnosis needs
-- (collective calls traced by `rankecho agent`: count, nodes, ranks, first and last call on the nodes'
-- clocks). What an empty answer tells its caller is there instead, and for which times.
WITH ev AS (
    SELECT cluster_id, count(*) AS events, min(timestamp_ns) AS first_ns, max(timestamp_ns) AS last_ns
    FROM events GROUP BY cluster_id
),
co AS (
    SELECT cluster_id, count(*) AS collectives, count(DISTINCT node_id) AS nodes,
           count(DISTINCT (node_id, rank)) AS ranks, min(enter_ns) AS agent_first_ns,
           max(enter_ns) AS agent_last_ns
    FROM collectives GROUP BY cluster_id
)
SELECT cluster_id, coalesce(ev.events, 0) AS events, coalesce(co.collectives, 0) AS collectives,
       co.nodes, co.ranks, co.agent_first_ns, co.agent_last_ns, ev.first_ns, ev.last_ns
FROM ev FULL JOIN co USING (cluster_id)
ORDER BY collectives DESC, cluster_id
LIMIT $max_rows;
