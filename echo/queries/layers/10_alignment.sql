-- Layer 1 of the straggler analysis: which collective instance each agent row belongs to.
-- Every rank reports its own row for one collective instance; the agent names the instance
-- <comm_id>:<seq>. That name is only trustworthy when the agent saw the communicator being created
-- (seq_aligned). An agent that attached mid-run (or restarted) counts seq from its attach and guesses
-- the comm id, so its streams are realigned here from the data: all ranks of one collective finish
-- together, so the right sequence shift is the one after which this stream's completion times differ
-- from a reference stream's by a constant (the clock offset) and nothing else.
-- Parameters of every layer: start_ns / end_ns (window on the node clocks, NULL = open) and cluster
-- (NULL = every cluster).

-- name: rk_collective_rows
-- One row per collective call in the window (send/recv left out: they pair two ranks, they do not
-- make everyone wait), with its stream: one process's calls on one communicator as one agent run
-- numbered them. The window is read 5 s wider on each side so clock offsets do not cut instances.
CREATE OR REPLACE TEMP MACRO rk_collective_rows(start_ns, end_ns, cluster) AS TABLE
SELECT cluster_id, node_id, rank, pid, process_start_ns, agent_instance, tid, op, comm_id, seq,
       coalesce(seq_aligned, false) AS seq_aligned, bytes, enter_ns, return_ns, complete_ns,
       causal_chain_id,
       hash(node_id, pid, process_start_ns,
            CASE WHEN coalesce(seq_aligned, false) THEN '' ELSE agent_instance END, comm_id) AS stream
FROM collectives
WHERE op IN ('ncclAllReduce', 'ncclAllGather', 'ncclReduceScatter', 'ncclBroadcast', 'ncclBcast', 'ncclReduce')
  AND comm_id IS NOT NULL AND seq IS NOT NULL AND rank IS NOT NULL
  AND (start_ns IS NULL OR enter_ns >= start_ns - 5000000000)
  AND (end_ns IS NULL OR enter_ns < end_ns + 5000000000)
  AND (cluster IS NULL OR cluster_id = cluster);

-- name: rk_aligned_rows
-- The window's collective rows on the cluster's common numbering: comm_key and seq_g (= seq + shift,
-- the same on every rank for one instance), chain_key = comm_key:seq_g (the realigned
-- causal_chain_id), and how the stream was placed (alignment): 'aligned' (the agent saw the
-- communicator's creation), 'realigned' (fitted to a reference stream; fit_ns is the fit's mean
-- deviation: a right shift leaves only completion noise), 'anchor' (an unaligned stream no aligned one
-- matches: it becomes the reference of its communicator, steps counted from what was observed),
-- 'unmatched' (no reference fits: comm_key is NULL and the rows stay out of cross-rank comparisons).
CREATE OR REPLACE TEMP MACRO rk_aligned_rows(start_ns, end_ns, cluster) AS TABLE
WITH numbered AS (
    SELECT *,
           lag(complete_ns) OVER s AS prev_complete_ns,
           lag(return_ns) OVER s AS prev_return_ns,
           count(*) OVER (PARTITION BY stream) AS stream_rows,
           min(complete_ns) OVER (PARTITION BY stream) AS first_complete
    FROM rk_collective_rows(start_ns, end_ns, cluster)
    WINDOW s AS (PARTITION BY stream ORDER BY seq)
),
rows AS MATERIALIZED (
    -- pos: place in the stream's completion group (0 = the first call one sync completed); prev_ns: the
    -- end of what came before it on the stream (the previous group's completion, else the previous
    -- call's return), which opens the window of what the rank did before calling
    SELECT * EXCLUDE (prev_complete_ns, prev_return_ns),
           seq - max(CASE WHEN complete_ns IS DISTINCT FROM prev_complete_ns THEN seq END)
                     OVER (PARTITION BY stream ORDER BY seq ROWS UNBOUNDED PRECEDING) AS pos,
           CASE WHEN complete_ns IS DISTINCT FROM prev_complete_ns THEN prev_complete_ns
                ELSE prev_return_ns END AS prev_ns
    FROM numbered
),
streams AS (  -- each stream's process and the shape of its calls (most common op and size)
    SELECT cluster_id, stream, any_value(comm_id) AS comm_id, bool_and(seq_aligned) AS seq_aligned,
           any_value(stream_rows) AS stream_rows, min(rank) AS rank, any_value(node_id) AS node_id,
           any_value(pid) AS pid, any_value(process_start_ns) AS started, mode(op) AS op, mode(bytes) AS bytes
    FROM rows GROUP BY cluster_id, stream
),
refs AS (
    -- references: the longest stream of each aligned communicator and shape, and one anchor per shape
    -- among the unaligned streams (an unaligned id says nothing across processes: the agent numbers
    -- communicators in the order each process happened to use them after it attached)
    (SELECT DISTINCT ON (cluster_id, comm_id, op, bytes) cluster_id, comm_id, seq_aligned, stream AS ref_stream
     FROM streams WHERE seq_aligned
     ORDER BY cluster_id, comm_id, op, bytes, stream_rows DESC, rank, stream)
    UNION ALL
    (SELECT DISTINCT ON (cluster_id, op, bytes) cluster_id, comm_id, seq_aligned, stream AS ref_stream
     FROM streams WHERE NOT seq_aligned
     ORDER BY cluster_id, op, bytes, stream_rows DESC, rank, stream)
),
sample AS MATERIALIZED (  -- up to 256 completed calls per unaligned stream, after its first (partial) step
    SELECT * FROM (
        SELECT *, row_number() OVER (PARTITION BY stream ORDER BY seq) AS nth
        FROM rows
        WHERE NOT seq_aligned AND complete_ns > first_complete)
    WHERE nth <= 256
),
sample_size AS (SELECT stream, count(*) AS size FROM sample GROUP BY stream),
span AS (SELECT cluster_id, min(complete_ns) - 5000000000 AS lo, max(complete_ns) + 5000000000 AS hi
         FROM sample GROUP BY cluster_id),
ref_rows AS MATERIALIZED (
    SELECT r.cluster_id, r.stream, r.op, r.bytes, r.pos, r.seq, r.complete_ns, f.comm_id, f.seq_aligned
    FROM rows r
    JOIN refs f ON f.ref_stream = r.stream
    JOIN span s ON s.cluster_id = r.cluster_id AND r.complete_ns BETWEEN s.lo AND s.hi
),
pairs AS MATERIALIZED (  -- every same-shaped call of a reference stream within 5 s: (shift, offset)
    SELECT s.stream, r.stream AS ref_stream, r.comm_id AS ref_comm, r.seq_aligned AS ref_aligned,
           r.seq - s.seq AS shift, s.complete_ns - r.complete_ns AS d
    FROM sample s
    JOIN ref_rows r
      ON r.cluster_id = s.cluster_id AND r.stream <> s.stream AND r.op = s.op
     AND r.bytes IS NOT DISTINCT FROM s.bytes AND r.pos = s.pos
     AND r.complete_ns BETWEEN s.complete_ns - 5000000000 AND s.complete_ns + 5000000000
),
fits AS (
    SELECT stream, ref_stream, ref_comm, ref_aligned, shift, count(*) AS n,
           median(d) AS offset_ns
    FROM pairs GROUP BY ALL
),
scored AS (
    SELECT f.stream, f.ref_stream, f.ref_comm, f.ref_aligned, f.shift, f.n, f.offset_ns,
           avg(abs(p.d - f.offset_ns)) AS fit_ns
    FROM fits f JOIN pairs p USING (stream, ref_stream, shift)
    GROUP BY ALL
),
eligible AS (  -- fits over at least half the stream's sample, within 2 ms
    SELECT s.* FROM scored s JOIN sample_size z USING (stream)
    WHERE s.n >= 0.5 * z.size AND s.fit_ns <= 2000000
),
best AS (  -- per unaligned stream: among eligible fits about as good as its best one, an aligned reference
    -- first, then the smallest clock offset: a timeline so regular that k steps later looks the same
    -- leaves a shift of k steps and an offset of k step times indistinguishable, and real clocks are far
    -- closer than a step apart
    SELECT DISTINCT ON (e.stream) e.*
    FROM eligible e
    JOIN (SELECT stream, min(fit_ns) AS best_fit FROM eligible GROUP BY stream) m USING (stream)
    WHERE e.fit_ns <= 1.5 * m.best_fit + 50000
    ORDER BY e.stream, e.ref_aligned DESC, abs(e.offset_ns), e.fit_ns
),
own_comm AS (  -- an unaligned stream of a process whose earlier agent run knew a communicator of the same
    -- shape (the agent restarted): that is the communicator, even when the fit found a sibling of it
    SELECT u.stream, min(a.comm_id) AS comm_id
    FROM streams u JOIN streams a
      ON a.node_id = u.node_id AND a.pid = u.pid AND a.started IS NOT DISTINCT FROM u.started
     AND a.op = u.op AND a.bytes IS NOT DISTINCT FROM u.bytes AND a.seq_aligned AND NOT u.seq_aligned
    GROUP BY u.stream
),
ref_of AS (  -- an anchor maps to its own aligned fit if it has one, else to itself
    SELECT f.ref_stream, f.comm_id, coalesce(b.ref_comm, f.comm_id) AS comm_key, coalesce(b.shift, 0) AS shift
    FROM refs f LEFT JOIN best b ON b.stream = f.ref_stream AND b.ref_aligned
),
placed AS (
SELECT t.cluster_id, t.stream,
       CASE WHEN t.seq_aligned THEN t.comm_id
            WHEN b.ref_aligned THEN coalesce(h.comm_id, b.ref_comm)
            WHEN b.stream IS NOT NULL THEN o.comm_key
            WHEN o.ref_stream IS NOT NULL THEN o.comm_key END AS comm_key,
       CASE WHEN t.seq_aligned THEN 0
            WHEN b.ref_aligned THEN b.shift
            WHEN b.stream IS NOT NULL THEN b.shift + o.shift
            WHEN o.ref_stream IS NOT NULL THEN o.shift END AS shift,
       CASE WHEN t.seq_aligned THEN 'aligned'
            WHEN b.stream IS NOT NULL THEN 'realigned'
            WHEN o.ref_stream IS NOT NULL THEN 'anchor'
            ELSE 'unmatched' END AS method,
       b.fit_ns, b.n AS fit_calls, b.offset_ns AS fit_offset_ns
FROM streams t
LEFT JOIN best b ON b.stream = t.stream
LEFT JOIN ref_of o ON o.ref_stream = coalesce(b.ref_stream, t.stream)
LEFT JOIN own_comm h ON h.stream = t.stream
)
SELECT r.* EXCLUDE (stream_rows, first_complete), p.comm_key, r.seq + p.shift AS seq_g,
       p.comm_key || ':' || (r.seq + p.shift) AS chain_key, p.shift, p.method AS alignment, p.fit_ns,
       p.fit_calls, p.fit_offset_ns
FROM rows r JOIN placed p USING (cluster_id, stream);


-- name: rk_stream_alignment
-- One row per stream (one process's calls on one communicator, as one agent run numbered them): how it
-- was placed on the common numbering (see rk_aligned_rows) and the rows it holds in the window.
CREATE OR REPLACE TEMP MACRO rk_stream_alignment(start_ns, end_ns, cluster) AS TABLE
SELECT cluster_id, node_id, rank, stream, comm_id, comm_key, shift, alignment, fit_ns, fit_calls, fit_offset_ns,
       count(*) AS calls
FROM rk_aligned_rows(start_ns, end_ns, cluster)
GROUP BY ALL;
