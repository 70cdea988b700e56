-- Layer 2: every rank's arrival at every collective instance on one clock, and the step it belongs to.
-- Clocks: nobody leaves a collective before the last rank arrives, so all ranks of one instance
-- complete together; each node's offset is the median over instances of how much later it reports
-- completion than another node of the same instance, chained out from the cluster's reference node (the
-- one with the most ranks; ties by name). Only instances spanning two or more nodes count, at most about
-- 20,000 of them (clock_sample_rows rows) (an even sample of the window: the offset is a median, more adds nothing).
-- Reference arrival of an instance: its lower-quartile arrival (reference_arrival_quantile: the 2nd of
-- 8, the earliest of 2 to 4), so up to three quarters of the ranks, a whole late node among them, can be late against it.
-- Steps: the cluster's primary communicator (the one most ranks share) defines them; a step is a
-- group of its collectives that one sync completes (the same group on every rank); a collective of
-- another communicator belongs to the step whose sync completed it on the process that references that
-- communicator. Group positions and steps are read off one reference stream per communicator.

-- name: rk_arrivals
-- One row per (instance, rank) on the reference clock (enter_c, return_c, complete_c), with the
-- instance around it: its step, its position in the step's completion group (pos: 0 = first
-- collective of the group on that communicator), ranks seen (n), the communicator's size (comm_size:
-- most ranks ever seen on one instance), the reference arrival (ref_c), host_late_ns against it, the
-- latest arrival's lateness (last_late_ns), the instance's completion (done_c: the earliest any rank saw
-- it complete) and first_rank (the lowest rank of the instance, to pick one row per instance); and the
-- node's clock offset (clock_offset_ns, subtracted) and the reference node (see rk_clock_offsets).
CREATE OR REPLACE TEMP MACRO rk_arrivals(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH clock AS MATERIALIZED (
    SELECT hash(cluster_id, node_id) AS node_key, offset_ns AS clock_offset_ns, reference_node
    FROM rk_clock_offsets(start_ns, end_ns, cluster, job := job)
),
streams AS MATERIALIZED (  -- the text that describes each stream, kept out of the per-row work
    SELECT stream, any_value(cluster_id) AS cluster_id, any_value(node_id) AS node_id, any_value(comm_key) AS comm_key,
           any_value(pid) AS pid, any_value(node_key) AS node_key, bool_and(seq_aligned) AS aligned,
           count(*) AS calls, min(rank) AS rank
    FROM rk_aligned_rows(start_ns, end_ns, cluster, job := job) GROUP BY stream
),
c AS MATERIALIZED (  -- the rows, on the reference clock: numbers only
    SELECT a.stream, a.rank, a.tid, a.seq, a.seq_g, a.inst_key, a.node_key, a.thread_key,
           a.enter_ns - k.clock_offset_ns AS enter_c, a.return_ns - k.clock_offset_ns AS return_c,
           a.complete_ns - k.clock_offset_ns AS complete_c, k.clock_offset_ns
    FROM rk_aligned_rows(start_ns, end_ns, cluster, job := job) a JOIN clock k USING (node_key)
),
inst AS MATERIALIZED (
    SELECT i.*, s.cluster_id, s.comm_key
    FROM (SELECT inst_key, any_value(stream) AS stream, any_value(seq_g) AS seq_g, count(*) AS n,
                 quantile_disc(enter_c, rk_param('reference_arrival_quantile')) AS ref_c, max(enter_c) AS last_c, min(complete_c) AS done_c,
                 min(rank) AS first_rank
          FROM c GROUP BY inst_key) i
    JOIN streams s USING (stream)
),
comm_ranks AS (SELECT cluster_id, comm_key, max(n) AS ranks, count(*) AS instances FROM inst GROUP BY ALL),
primary_comm AS (
    SELECT DISTINCT ON (cluster_id) cluster_id, comm_key AS primary_key
    FROM comm_ranks ORDER BY cluster_id, ranks DESC, instances DESC, comm_key
),
ref_streams AS (  -- per communicator: the stream that saw the most of it, an aligned one first
    SELECT DISTINCT ON (cluster_id, comm_key) stream, cluster_id, comm_key, node_key, pid
    FROM streams
    ORDER BY cluster_id, comm_key, aligned DESC, calls DESC, rank, stream
),
ref_calls AS MATERIALIZED (  -- the reference streams' calls with their place in the completion group
    SELECT *, seq - max(rk_group_position(complete_c, prev_complete_c, seq))
                        OVER (PARTITION BY stream ORDER BY seq ROWS UNBOUNDED PRECEDING) AS pos
    FROM (SELECT r.cluster_id, r.comm_key, c.inst_key, c.seq_g, c.seq, c.stream, c.complete_c, r.node_key, r.pid,
                 lag(c.complete_c) OVER (PARTITION BY c.stream ORDER BY c.seq) AS prev_complete_c
          FROM c JOIN ref_streams r USING (stream))
),
starts AS (  -- the primary communicator's reference calls, numbered by the step they open
    SELECT r.*, CAST(sum(CASE WHEN r.pos = 0 THEN 1 ELSE 0 END) OVER (PARTITION BY r.cluster_id ORDER BY r.seq_g)
                     AS BIGINT) AS nth
    FROM ref_calls r JOIN primary_comm p ON p.cluster_id = r.cluster_id AND p.primary_key = r.comm_key
),
group_size AS (  -- collectives per step on the primary communicator: steps are seq_g // size when regular
    SELECT cluster_id, median(n) AS size, min(n) = max(n) AS regular
    FROM (SELECT cluster_id, nth, count(*) AS n FROM starts WHERE nth > 0 GROUP BY ALL)
    GROUP BY cluster_id
),
first_start AS (SELECT cluster_id, min(seq_g) AS seq_g FROM starts WHERE pos = 0 GROUP BY cluster_id),
primary_steps AS MATERIALIZED (
    SELECT s.inst_key, s.nth - 1 + CASE WHEN g.regular THEN CAST(f.seq_g // g.size AS BIGINT) ELSE 0 END AS step
    FROM starts s JOIN group_size g USING (cluster_id) JOIN first_start f USING (cluster_id)
    WHERE s.nth > 0
),
sync_steps AS (  -- per reference process and completing sync: the step (from its primary calls)
    SELECT s.node_key, s.pid, c.complete_c, min(p.step) AS step
    FROM c
    JOIN (SELECT stream, node_key, pid FROM streams SEMI JOIN ref_streams r USING (node_key, pid)) s USING (stream)
    JOIN primary_steps p USING (inst_key)
    WHERE c.complete_c IS NOT NULL
    GROUP BY ALL
),
placed AS MATERIALIZED (  -- every instance: its position in the group and its step
    SELECT r.inst_key, r.pos, coalesce(p.step, s.step) AS step
    FROM ref_calls r
    LEFT JOIN primary_steps p USING (inst_key)
    LEFT JOIN sync_steps s ON s.node_key = r.node_key AND s.pid = r.pid AND s.complete_c = r.complete_c
),
context AS MATERIALIZED (  -- per instance, everything a row needs to know about it
    SELECT i.inst_key, i.n, i.ref_c, i.last_c, i.done_c, i.first_rank, p.step, p.pos, m.ranks AS comm_size,
           q.primary_key = i.comm_key AS on_primary
    FROM inst i
    JOIN comm_ranks m USING (cluster_id, comm_key)
    JOIN primary_comm q USING (cluster_id)
    LEFT JOIN placed p USING (inst_key)
    WHERE (start_ns IS NULL OR i.ref_c >= start_ns) AND (end_ns IS NULL OR i.ref_c < end_ns)
)
SELECT s.cluster_id, s.node_id, c.rank, s.pid, c.tid, c.stream, c.seq, s.comm_key, c.seq_g, c.inst_key, c.node_key,
       c.thread_key, s.aligned AS seq_aligned, c.enter_c, c.return_c, c.complete_c,
       c.clock_offset_ns, k.reference_node,
       x.n, x.step, x.pos, x.ref_c, x.done_c, x.first_rank, CAST(c.enter_c - x.ref_c AS BIGINT) AS host_late_ns,
       CAST(x.last_c - x.ref_c AS BIGINT) AS last_late_ns, x.comm_size, x.on_primary
FROM c JOIN context x USING (inst_key) JOIN streams s USING (stream) JOIN clock k ON k.node_key = c.node_key;

-- name: rk_clock_offsets
-- Per (cluster, node): offset_ns subtracted from that node's timestamps to put them on the reference
-- node's clock, its uncertainty (1.4826 * MAD / sqrt(n) of the per-instance differences, summed in
-- quadrature along the path), the instances it rests on (those of the last hop) and the reference node.
-- Each shared instance gives each node's completion (the median of its ranks') minus the completion of the
-- instance's anchor: the reference node when it took part, else the instance's first node by name. A
-- difference is between two nodes of one instance, so instances of different node sets never mix: a
-- deviation from an instance's median would (a node in the world and in pairs with a node 20 ms off came
-- out 5 ms off, and its peers were then named late). Nodes are placed outwards from the reference over
-- these pairs, fewest hops first, then the pair with the most instances. A node that shares no instance
-- with a placed node keeps offset 0 with NULL uncertainty.
CREATE OR REPLACE TEMP MACRO rk_clock_offsets(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH RECURSIVE a AS (SELECT cluster_id, node_id, rank, comm_key, seq_g, complete_ns
           FROM rk_aligned_rows(start_ns, end_ns, cluster, job := job)),
every AS (SELECT greatest(1, count(*) // rk_param('clock_sample_rows')) AS k FROM a),
nodes AS (SELECT cluster_id, node_id, count(DISTINCT rank) AS ranks FROM a GROUP BY ALL),
reference AS (
    SELECT DISTINCT ON (cluster_id) cluster_id, node_id AS reference_node
    FROM nodes ORDER BY cluster_id, ranks DESC, node_id
),
node_done AS MATERIALIZED (  -- about 20,000 instances spread over the window: each node's completion
    SELECT cluster_id, comm_key, seq_g, node_id, median(complete_ns) AS done_ns FROM a
    WHERE complete_ns IS NOT NULL AND seq_g % (SELECT k FROM every) = 0
    GROUP BY ALL
),
anchors AS (  -- instances seen on two or more nodes: the only ones that say anything about clocks
    SELECT d.cluster_id, d.comm_key, d.seq_g,
           CASE WHEN bool_or(d.node_id = r.reference_node) THEN any_value(r.reference_node)
                ELSE min(d.node_id) END AS anchor
    FROM node_done d JOIN reference r USING (cluster_id)
    GROUP BY ALL HAVING count(*) >= 2
),
diffs AS (
    SELECT d.cluster_id, x.anchor AS node_from, d.node_id AS node_to, d.done_ns - f.done_ns AS d
    FROM node_done d JOIN anchors x USING (cluster_id, comm_key, seq_g)
    JOIN node_done f ON f.cluster_id = d.cluster_id AND f.comm_key = d.comm_key AND f.seq_g = d.seq_g
                    AND f.node_id = x.anchor
    WHERE d.node_id <> x.anchor
),
pair_median AS (SELECT cluster_id, node_from, node_to, median(d) AS med, count(*) AS n FROM diffs GROUP BY ALL),
pair_spread AS (
    SELECT p.cluster_id, p.node_from, p.node_to, p.med, p.n, median(abs(d.d - p.med)) AS mad
    FROM pair_median p JOIN diffs d USING (cluster_id, node_from, node_to) GROUP BY ALL
),
pairs AS MATERIALIZED (  -- both directions of every pair, with the variance of its median
    SELECT cluster_id, node_from, node_to, med, n, (1.4826 * mad) ^ 2 / n AS var FROM pair_spread
    UNION ALL
    SELECT cluster_id, node_to, node_from, -med, n, (1.4826 * mad) ^ 2 / n FROM pair_spread
),
placed(cluster_id, node_id, hops, offset_ns, var, instances) USING KEY (cluster_id, node_id) AS (
    SELECT r.cluster_id, r.reference_node, 0, 0::DOUBLE, 0::DOUBLE,
           (SELECT count(*) FROM anchors x WHERE x.cluster_id = r.cluster_id AND x.anchor = r.reference_node)
    FROM reference r
    UNION
    SELECT p.cluster_id, p.node_to, w.hops + 1, w.offset_ns + p.med, w.var + p.var, p.n
    FROM placed w JOIN pairs p ON p.cluster_id = w.cluster_id AND p.node_from = w.node_id
    LEFT JOIN recurring.placed known ON known.cluster_id = p.cluster_id AND known.node_id = p.node_to
    WHERE known.node_id IS NULL
    QUALIFY row_number() OVER (PARTITION BY p.cluster_id, p.node_to ORDER BY p.n DESC, p.node_from) = 1
)
SELECT n.cluster_id, n.node_id, n.ranks,
       CAST(coalesce(p.offset_ns, 0) AS BIGINT) AS offset_ns,
       sqrt(p.var) AS uncertainty_ns,
       coalesce(p.instances, 0) AS instances,
       r.reference_node
FROM nodes n
JOIN reference r USING (cluster_id)
LEFT JOIN placed p USING (cluster_id, node_id);
