-- Layer 7: call stacks (schema v6, docs/stacks.md). What a rank's threads were running while the
-- analysis's time passed, as stacks weighted by that time, and the late rank's stacks against its
-- peers'. Time comes from two sources, per thread window (node clock):
--   'interval': each raw interval (host_activity) with a stack and a category, clipped to the window;
--   'breakdown': each collective entered in the window with the agent's pre-call breakdown: per cause
--     class, the class's time carried by the stack the agent named for it (rankecho.pre.<class>_stack:
--     the stack that carried most of it, so the class's whole time goes to that one stack), and the
--     rest of its window (host compute) to the on-CPU sampler's most seen stack.
-- A class of a call that raw intervals with stacks already cover in that call's window is taken from
-- the intervals alone (they are exact; the breakdown names one stack per class). Stack ids a row cites
-- without a stored `stacks` row come back with frames NULL.

-- name: rk_lead_frames
-- The first n known frames of a stack, callee first: 'cudaMalloc <- allocate_cache <- train.py:forward:88'.
CREATE OR REPLACE TEMP MACRO rk_lead_frames(frames, n) AS (
    array_to_string(list_filter(frames, lambda f: f <> '[unknown]')[1:n], ' <- ')
);

-- name: rk_folded_frames
-- A stack in folded form (flamegraph.pl, speedscope): root first, ';'-joined (a ';' inside a frame
-- becomes ':').
CREATE OR REPLACE TEMP MACRO rk_folded_frames(frames) AS (
    array_to_string(list_transform(list_reverse(frames), lambda f: replace(f, ';', ':')), ';')
);

-- name: rk_stack_spans
-- One row per piece of stack-carried time in the windows ws (a list of {w, role, cluster_id, node_id,
-- pid, tid, from_ns, to_ns}: one thread over [from_ns, to_ns) of its node's clock; w numbers them):
-- w, role, source ('interval' | 'breakdown'), category (a cause class), stack_id and weight_ns.
CREATE OR REPLACE TEMP MACRO rk_stack_spans(ws) AS TABLE
WITH w AS MATERIALIZED (
    SELECT *, hash(cluster_id, node_id, pid, tid) AS thread_key FROM (SELECT unnest(ws, recursive := true))
),
span AS MATERIALIZED (  -- constant bounds over every window, so the scans can skip whole row groups
    SELECT min(from_ns) // 1000000000 - rk_param('stack_lookback_s') AS lo_bucket,
           max(to_ns) // 1000000000 AS hi_bucket,
           min(from_ns) AS lo, max(to_ns) + rk_param('stack_slack_ns') AS hi
    FROM w
),
iv AS MATERIALIZED (
    SELECT w.w, w.role, h.category, h.stack_id, h.start_ns,
           least(h.end_ns, w.to_ns) - greatest(h.start_ns, w.from_ns) AS weight_ns
    FROM w
    JOIN host_activity h ON h.thread_key = w.thread_key
     AND h.start_bucket BETWEEN w.from_ns // 1000000000 - rk_param('stack_lookback_s') AND w.to_ns // 1000000000
     AND h.end_ns > w.from_ns AND h.start_ns < w.to_ns
    WHERE h.stack_id IS NOT NULL AND h.category IS NOT NULL
      AND h.start_bucket BETWEEN (SELECT lo_bucket FROM span) AND (SELECT hi_bucket FROM span)
),
bd AS (
    SELECT w, role, enter_ns, from_ns, unnest(parts, recursive := true)
    FROM (
        SELECT w.w, w.role, c.enter_ns, c.enter_ns - c.pre_window_ns AS from_ns,
               [{'category': 'allocator', 'stack_id': c.pre_allocator_stack, 'ns': c.pre_allocator_ns},
                {'category': 'slow_gpu', 'stack_id': c.pre_slow_gpu_stack, 'ns': c.pre_slow_gpu_ns},
                {'category': 'memcpy', 'stack_id': c.pre_memcpy_stack, 'ns': c.pre_memcpy_ns},
                {'category': 'cpu_contention', 'stack_id': c.pre_cpu_contention_stack, 'ns': c.pre_cpu_contention_ns},
                {'category': 'sleeping', 'stack_id': c.pre_sleeping_stack, 'ns': c.pre_sleeping_ns},
                {'category': 'host_compute', 'stack_id': c.pre_oncpu_stack,
                 'ns': greatest(c.pre_window_ns - c.pre_allocator_ns - c.pre_slow_gpu_ns - c.pre_memcpy_ns
                                - c.pre_cpu_contention_ns - c.pre_sleeping_ns, 0)}] AS parts
        FROM w
        JOIN collectives c ON c.thread_key = w.thread_key
         AND c.enter_ns > w.from_ns + rk_param('stack_slack_ns') AND c.enter_ns <= w.to_ns + rk_param('stack_slack_ns')
        WHERE c.pre_window_ns IS NOT NULL
          AND c.enter_ns BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)
    )
)
SELECT w, role, 'interval' AS source, category, stack_id, weight_ns FROM iv
UNION ALL
SELECT b.w, b.role, 'breakdown' AS source, b.category, b.stack_id, b.ns AS weight_ns
FROM bd b
WHERE b.stack_id IS NOT NULL AND b.ns > 0
  AND NOT EXISTS (SELECT 1 FROM iv WHERE iv.w = b.w AND iv.category = b.category
                                     AND iv.start_ns >= b.from_ns AND iv.start_ns < b.enter_ns);

-- name: rk_rank_windows
-- The windows of rk_stack_spans for rank r over [from_t, to_t) (its node's clock; NULL = open): one per
-- thread of the rank seen in the range (intervals or collectives), all role 'rank'. node NULL = any node.
CREATE OR REPLACE TEMP MACRO rk_rank_windows(from_t, to_t, cluster, node, r, job := NULL) AS TABLE
WITH b AS (
    SELECT coalesce(from_t, 0) AS lo, coalesce(to_t, CAST(9e18 AS BIGINT)) AS hi,  -- open ends
           CAST(rk_param('stack_lookback_s') AS BIGINT) * 1000000000 AS lookback_ns
),
threads AS (
    SELECT DISTINCT h.cluster_id, h.node_id, h.pid, h.tid FROM host_activity h, b
    WHERE h.rank = r AND h.start_ns >= b.lo - b.lookback_ns AND h.start_ns < b.hi AND h.end_ns > b.lo
      AND (node IS NULL OR h.node_id = node) AND (cluster IS NULL OR h.cluster_id = cluster)
      AND (job IS NULL OR h.job_id = job)
    UNION
    SELECT DISTINCT c.cluster_id, c.node_id, c.pid, c.tid FROM collectives c, b
    WHERE c.rank = r AND c.enter_ns > b.lo AND c.enter_ns <= b.hi
      AND (node IS NULL OR c.node_id = node) AND (cluster IS NULL OR c.cluster_id = cluster)
      AND (job IS NULL OR c.job_id = job)
)
SELECT coalesce(list({'w': CAST(i AS INTEGER), 'role': 'rank', 'cluster_id': cluster_id, 'node_id': node_id,
                      'pid': pid, 'tid': tid, 'from_ns': lo, 'to_ns': hi}), []) AS ws
FROM (SELECT row_number() OVER (ORDER BY cluster_id, node_id, pid, tid) AS i, * FROM threads), b;

-- name: rk_call_windows
-- The windows of rk_stack_spans before the collectives with causal_chain_id in chains of ranks rs on
-- node: each call's thread over its pre-call window (the agent's, else default_window_ns), role 'rank'.
-- lo / hi (node clock, NULL = open) bound where the calls are looked for.
CREATE OR REPLACE TEMP MACRO rk_call_windows(cluster, node, rs, chains, job := NULL, lo := NULL, hi := NULL) AS TABLE
SELECT coalesce(list({'w': CAST(i AS INTEGER), 'role': 'rank', 'cluster_id': cluster_id, 'node_id': node_id,
                      'pid': pid, 'tid': tid, 'from_ns': from_ns, 'to_ns': enter_ns}), []) AS ws
FROM (
    SELECT row_number() OVER () AS i, c.cluster_id, c.node_id, c.pid, c.tid, c.enter_ns,
           c.enter_ns - coalesce(c.pre_window_ns, rk_param('default_window_ns')) AS from_ns
    FROM collectives c
    WHERE list_contains(chains, c.causal_chain_id) AND list_contains(rs, c.rank) AND c.node_id = node
      AND (cluster IS NULL OR c.cluster_id = cluster) AND (job IS NULL OR c.job_id = job)
      AND (lo IS NULL OR c.enter_ns >= lo) AND (hi IS NULL OR c.enter_ns < hi)
);

-- name: rk_top_stacks
-- The stacks of the windows ws by the time they carried, most first: stack_id, ms, the ms per category,
-- its frames (NULL: not stored), truncated and its leading frames.
CREATE OR REPLACE TEMP MACRO rk_top_stacks(ws) AS TABLE
WITH per AS (
    SELECT stack_id, category, sum(weight_ns) AS ns FROM rk_stack_spans(ws) GROUP BY ALL
)
SELECT p.stack_id, sum(p.ns) / 1e6 AS ms, arg_max(p.category, p.ns) AS category,
       map(list(p.category ORDER BY p.category), list(p.ns / 1e6 ORDER BY p.category)) AS ms_by_category,
       any_value(s.frames) AS frames, any_value(s.truncated) AS truncated,
       rk_lead_frames(any_value(s.frames), rk_param('stack_lead_frames')) AS leading_frames
FROM per p LEFT JOIN stacks s USING (stack_id)
GROUP BY p.stack_id
ORDER BY ms DESC, p.stack_id;

-- name: rk_stack_diff
-- The differential view: for windows ws whose role is 'target' (the late rank's) or 'peer' (its
-- on-time peers' at the same collective), each stack's time on the target against the mean over the
-- peers (a peer without the stack counts 0): target_ms, peers_mean_ms, peers_with (peers that ran it at
-- all), excess_ms (target - peers' mean) and distinctive (its excess is at least min_distinct_share of
-- the target's stack-carried time): what the late rank did that the others did not, largest excess first.
CREATE OR REPLACE TEMP MACRO rk_stack_diff(ws) AS TABLE
WITH spans AS MATERIALIZED (SELECT * FROM rk_stack_spans(ws)),
n AS (
    SELECT count(DISTINCT x.w) FILTER (WHERE x.role = 'peer') AS peers
    FROM (SELECT unnest(ws, recursive := true)) x
),
per AS (
    SELECT stack_id,
           coalesce(sum(weight_ns) FILTER (WHERE role = 'target'), 0) AS target_ns,
           coalesce(sum(weight_ns) FILTER (WHERE role = 'peer'), 0) AS peers_ns,
           count(DISTINCT w) FILTER (WHERE role = 'peer') AS peers_with,
           arg_max(category, weight_ns) FILTER (WHERE role = 'target') AS category,
           arg_max(category, weight_ns) AS any_category
    FROM spans GROUP BY stack_id
),
total AS (SELECT sum(target_ns) AS ns FROM per)
SELECT p.stack_id, coalesce(p.category, p.any_category) AS category,
       p.target_ns / 1e6 AS target_ms, p.peers_ns / nullif(n.peers, 0) / 1e6 AS peers_mean_ms,
       p.peers_with, n.peers,
       (p.target_ns - coalesce(p.peers_ns / nullif(n.peers, 0), 0)) / 1e6 AS excess_ms,
       (p.target_ns - coalesce(p.peers_ns / nullif(n.peers, 0), 0)) >= rk_param('stack_min_distinct_share') * total.ns
           AND p.target_ns > 0 AS distinctive,
       s.frames, s.truncated, rk_lead_frames(s.frames, rk_param('stack_lead_frames')) AS leading_frames
FROM per p CROSS JOIN n CROSS JOIN total
LEFT JOIN stacks s USING (stack_id)
ORDER BY excess_ms DESC, p.target_ns DESC, p.stack_id;
