-- Layer 2: every rank's arrival at every collective instance on one clock, and the step it belongs to.
-- Clocks: nobody leaves a collective before the last rank arrives, so all ranks of one instance
-- complete together; each node's offset is the median over instances of how much later its ranks
-- report completion than the instance's median, relative to the cluster's reference node (the one
-- with the most ranks; ties by name). Only instances spanning two or more nodes count.
-- Steps: the cluster's primary communicator (the one most ranks share) defines them; a step is a
-- group of its collectives that one sync completes (the same group on every rank); a collective of
-- another communicator belongs to the step whose sync completed it on that process.

-- name: rk_arrivals
-- One row per (instance, rank) on the reference clock (enter_c, return_c, complete_c), with its step,
-- its position in the step's completion group (pos: 0 = first collective of the group on that
-- communicator), the end of what the rank did before (prev_c: its previous completion, or its
-- previous call's return within a group), and the instance around it: ranks seen (n), the
-- communicator's size (comm_size: most ranks ever seen on one instance), the reference arrival
-- (ref_c: median of the earliest half of the arrivals, so a whole late node cannot pull it late),
-- host_late_ns against it and the instance's completion (done_c);
-- and the node's clock: clock_offset_ns (subtracted), its uncertainty and the reference node.
CREATE OR REPLACE TEMP MACRO rk_arrivals(start_ns, end_ns, cluster) AS TABLE
WITH a AS MATERIALIZED (SELECT * FROM rk_aligned_rows(start_ns, end_ns, cluster) WHERE comm_key IS NOT NULL),
shared AS (  -- instances seen on two or more nodes: the only ones that say anything about clocks
    SELECT cluster_id, comm_key, seq_g, median(complete_ns) AS mid
    FROM a WHERE complete_ns IS NOT NULL
    GROUP BY ALL HAVING count(DISTINCT node_id) >= 2
),
dev AS (
    SELECT a.cluster_id, a.node_id, a.complete_ns - s.mid AS d
    FROM a JOIN shared s USING (cluster_id, comm_key, seq_g)
    WHERE a.complete_ns IS NOT NULL
),
per_node AS (SELECT cluster_id, node_id, median(d) AS med, count(*) AS n FROM dev GROUP BY ALL),
spread AS (
    SELECT p.cluster_id, p.node_id, p.med, p.n, median(abs(d.d - p.med)) AS mad
    FROM per_node p JOIN dev d USING (cluster_id, node_id) GROUP BY ALL
),
nodes AS (SELECT cluster_id, node_id, count(DISTINCT rank) AS ranks FROM a GROUP BY ALL),
reference AS (
    SELECT DISTINCT ON (cluster_id) cluster_id, node_id AS reference_node
    FROM nodes ORDER BY cluster_id, ranks DESC, node_id
),
clock AS (
    SELECT n.cluster_id, n.node_id,
           CAST(coalesce(s.med - rs.med, 0) AS BIGINT) AS clock_offset_ns,
           1.4826 * s.mad / sqrt(s.n) AS clock_uncertainty_ns,
           coalesce(s.n, 0) AS clock_instances,
           r.reference_node
    FROM nodes n
    JOIN reference r USING (cluster_id)
    LEFT JOIN spread s USING (cluster_id, node_id)
    LEFT JOIN spread rs ON rs.cluster_id = n.cluster_id AND rs.node_id = r.reference_node
),
c AS MATERIALIZED (
    SELECT a.* EXCLUDE (enter_ns, return_ns, complete_ns, prev_ns),
           a.enter_ns - k.clock_offset_ns AS enter_c, a.return_ns - k.clock_offset_ns AS return_c,
           a.complete_ns - k.clock_offset_ns AS complete_c, a.prev_ns - k.clock_offset_ns AS prev_c,
           k.clock_offset_ns, k.clock_uncertainty_ns, k.clock_instances, k.reference_node
    FROM a JOIN clock k USING (cluster_id, node_id)
),
comm_ranks AS (SELECT cluster_id, comm_key, count(DISTINCT rank) AS ranks, count(DISTINCT seq_g) AS instances
               FROM c GROUP BY ALL),
primary_comm AS (
    SELECT DISTINCT ON (cluster_id) cluster_id, comm_key AS primary_key
    FROM comm_ranks ORDER BY cluster_id, ranks DESC, instances DESC, comm_key
),
primary_inst AS MATERIALIZED (  -- the primary communicator's instances, with the start of each step
    SELECT c.cluster_id, c.comm_key, c.seq_g, mode(c.pos) AS pos
    FROM c JOIN primary_comm p ON p.cluster_id = c.cluster_id AND p.primary_key = c.comm_key
    GROUP BY ALL
),
starts AS (
    SELECT *, CAST(sum(CASE WHEN pos = 0 THEN 1 ELSE 0 END) OVER (PARTITION BY cluster_id ORDER BY seq_g) AS BIGINT) AS nth
    FROM primary_inst
),
group_size AS (  -- collectives per step on the primary communicator: steps are seq_g // size when regular
    SELECT cluster_id, median(n) AS size, min(n) = max(n) AS regular
    FROM (SELECT cluster_id, nth, count(*) AS n FROM starts WHERE nth > 0 GROUP BY ALL)
    GROUP BY cluster_id
),
first_start AS (SELECT cluster_id, min(seq_g) AS seq_g FROM starts WHERE pos = 0 GROUP BY cluster_id),
primary_steps AS (
    SELECT s.cluster_id, s.comm_key, s.seq_g,
           s.nth - 1 + CASE WHEN g.regular THEN CAST(f.seq_g // g.size AS BIGINT) ELSE 0 END AS step
    FROM starts s JOIN group_size g USING (cluster_id) JOIN first_start f USING (cluster_id)
    WHERE s.nth > 0
),
sync_steps AS (  -- the step of each sync that completed primary collectives, per process
    SELECT c.cluster_id, c.node_id, c.pid, c.complete_c, min(p.step) AS step
    FROM c JOIN primary_steps p USING (cluster_id, comm_key, seq_g)
    WHERE c.complete_c IS NOT NULL
    GROUP BY ALL
),
stepped AS MATERIALIZED (  -- any row: the step whose sync completed it on that process
    SELECT c.*, s.step AS row_step
    FROM c LEFT JOIN sync_steps s USING (cluster_id, node_id, pid, complete_c)
),
inst AS (
    SELECT cluster_id, comm_key, seq_g,
           count(*) AS n,
           count(DISTINCT node_id) AS n_nodes,
           mode(row_step) AS step,
           list_median(list_slice(list_sort(list(enter_c)), 1, CAST(ceil(count(*) / 2) AS BIGINT))) AS ref_c,
           median(complete_c) AS done_c
    FROM stepped GROUP BY ALL
)
SELECT s.* EXCLUDE (row_step), i.n, i.n_nodes, i.step, i.ref_c, i.done_c,
       CAST(s.enter_c - i.ref_c AS BIGINT) AS host_late_ns, m.ranks AS comm_size,
       p.primary_key = s.comm_key AS on_primary
FROM stepped s
JOIN inst i USING (cluster_id, comm_key, seq_g)
JOIN comm_ranks m USING (cluster_id, comm_key)
JOIN primary_comm p USING (cluster_id)
WHERE (start_ns IS NULL OR i.ref_c >= start_ns) AND (end_ns IS NULL OR i.ref_c < end_ns);

-- name: rk_clock_offsets
-- Per (cluster, node): offset_ns subtracted from that node's timestamps to put them on the reference
-- node's clock, its uncertainty (1.4826 * MAD / sqrt(n) of the per-instance deviations), the
-- instances it rests on, and the reference node. A node that shares no instance with another node
-- keeps offset 0 with NULL uncertainty.
CREATE OR REPLACE TEMP MACRO rk_clock_offsets(start_ns, end_ns, cluster) AS TABLE
SELECT cluster_id, node_id, count(DISTINCT rank) AS ranks, any_value(clock_offset_ns) AS offset_ns,
       any_value(clock_uncertainty_ns) AS uncertainty_ns, any_value(clock_instances) AS instances,
       any_value(reference_node) AS reference_node
FROM rk_arrivals(start_ns, end_ns, cluster)
GROUP BY cluster_id, node_id;
