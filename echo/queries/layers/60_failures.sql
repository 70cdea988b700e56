-- Layer 6: the failures that are not a late rank: desyncs, hangs and crashes (fleet.cluster.find_hangs).
-- They read the agents' rows as sent: only calls whose agent saw the communicator created
-- (seq_aligned), so causal_chain_id names the same instance on every rank. Times are node clocks, not
-- corrected (a hang is tens of seconds old, a crash orders exits tens of ms apart: offsets larger than
-- that would need rk_clock_offsets). The agent sends a collective when a sync completes it or, without
-- completion (rankecho.complete_ns NULL), after 10 s or when its process exits; so during a hang the
-- ranks that entered show up within ~10 s and the missing rank's call never does.
-- A cluster runs many jobs, each with ranks 0..N-1: every join and partition below is per
-- (cluster_id, job_id), and `job := NULL` (every job) or a job id narrows them all.
-- A hang is an open instance older than greatest(hang_min_ns, hang_steps x the job's typical step)
-- (parameters of rk_params): NCCL's own watchdog is minutes, a data loader hiccup is seconds, and a slow
-- job's steps can be long. Below the max(30 s, 10 steps) a hang must be named within (issue 24), by a
-- margin for the agents' 10 s pending timeout and a poll.

-- name: rk_failure_rows
-- The collective calls (send/recv left out) whose instance id holds across ranks, in the window.
CREATE OR REPLACE TEMP MACRO rk_failure_rows(start_ns, end_ns, cluster, job := NULL) AS TABLE
SELECT cluster_id, job_id, node_id, rank, pid, op, comm_id, seq, comm_nranks, bytes, enter_ns, complete_ns, causal_chain_id
FROM collectives
WHERE seq_aligned AND comm_id IS NOT NULL AND seq IS NOT NULL AND rank IS NOT NULL
  AND op NOT IN ('ncclSend', 'ncclRecv')
  AND (start_ns IS NULL OR enter_ns >= start_ns) AND (end_ns IS NULL OR enter_ns < end_ns)
  AND (cluster IS NULL OR cluster_id = cluster) AND (job IS NULL OR job_id = job);

-- name: rk_exits
-- The ranks' process exits the agents saw (rankecho.process.exit), with the exit status when the
-- process called exit_group (NULL: killed by a signal, or unknown) and the instance it was to enter next
-- (step_chain: the next collective of its primary communicator).
CREATE OR REPLACE TEMP MACRO rk_exits(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH x AS (
    SELECT *, coalesce(json_extract_string(attrs_json, '$."rankecho.job.id"'), '') AS job_id
    FROM events_generic  -- process exits are generic events (not typed: echo/store/typed_events.py)
    WHERE metric_name = 'rankecho.process.exit' AND rank IS NOT NULL
      AND (start_ns IS NULL OR timestamp_ns >= start_ns) AND (end_ns IS NULL OR timestamp_ns < end_ns)
      AND (cluster IS NULL OR cluster_id = cluster)
)
SELECT cluster_id, job_id, node_id, rank, timestamp_ns AS exit_ns,
       CASE WHEN value_int >= 0 THEN value_int END AS status, causal_chain_id AS step_chain,
       TRY_CAST(json_extract_string(attrs_json, '$."process.pid"') AS BIGINT) AS pid
FROM x
WHERE job IS NULL OR job_id = job;

-- name: rk_desyncs
-- One row per instance whose ranks issued different collectives (op or byte count) at the same sequence
-- number: what most ranks issued (usual_op, usual_bytes; a tie goes to the version the lowest rank
-- issued), the ranks that issued something else (odd_calls) and the first of them to call (first_rank).
CREATE OR REPLACE TEMP MACRO rk_desyncs(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH r AS MATERIALIZED (SELECT * FROM rk_failure_rows(start_ns, end_ns, cluster, job := job)),
mixed AS (
    SELECT cluster_id, job_id, causal_chain_id FROM r GROUP BY ALL
    HAVING count(DISTINCT op) > 1 OR count(DISTINCT bytes) > 1
),
calls AS (
    SELECT r.*, count(*) OVER (PARTITION BY r.cluster_id, r.job_id, r.causal_chain_id, r.op, r.bytes) AS same,
           min(r.rank) OVER (PARTITION BY r.cluster_id, r.job_id, r.causal_chain_id, r.op, r.bytes) AS lowest
    FROM r SEMI JOIN mixed USING (cluster_id, job_id, causal_chain_id)
),
usual AS (
    SELECT DISTINCT ON (cluster_id, job_id, causal_chain_id) cluster_id, job_id, causal_chain_id, op AS usual_op,
           bytes AS usual_bytes
    FROM calls ORDER BY cluster_id, job_id, causal_chain_id, same DESC, lowest
),
marked AS (
    SELECT c.*, u.usual_op, u.usual_bytes,
           (c.op IS DISTINCT FROM u.usual_op OR c.bytes IS DISTINCT FROM u.usual_bytes) AS odd
    FROM calls c JOIN usual u USING (cluster_id, job_id, causal_chain_id)
)
SELECT cluster_id, job_id, any_value(comm_id) AS comm_id, any_value(seq) AS seq, causal_chain_id,
       min(enter_ns) AS first_enter_ns, count(*) AS ranks, usual_op, usual_bytes,
       arg_min(rank, enter_ns) FILTER (WHERE odd) AS first_rank,
       list({'rank': rank, 'node_id': node_id, 'op': op, 'bytes': bytes} ORDER BY enter_ns) FILTER (WHERE odd)
           AS odd_calls
FROM marked
GROUP BY cluster_id, job_id, causal_chain_id, usual_op, usual_bytes;

-- name: rk_step_time
-- Per cluster, the job's typical step: the median time between consecutive completions (distinct sync
-- returns) of one process's calls on one communicator; buckets completed by one sync count once.
CREATE OR REPLACE TEMP MACRO rk_step_time(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH done AS (
    SELECT DISTINCT cluster_id, job_id, node_id, pid, comm_id, complete_ns
    FROM rk_failure_rows(start_ns, end_ns, cluster, job := job) WHERE complete_ns IS NOT NULL
),
gaps AS (
    SELECT cluster_id, job_id,
           complete_ns - lag(complete_ns) OVER (PARTITION BY cluster_id, node_id, pid, comm_id ORDER BY complete_ns)
               AS gap_ns
    FROM done
)
SELECT cluster_id, job_id, CAST(median(gap_ns) AS BIGINT) AS step_ns FROM gaps WHERE gap_ns > 0 GROUP BY ALL;

-- name: rk_open_instances
-- Instances that some ranks entered and none saw complete, while other ranks of the communicator (those
-- seen on it in the window) never entered: who entered (entered), who did not and has not exited since its
-- last call (missing: hung, not crashed), how many of the communicator's ranks were never seen at all
-- (unseen), and the hang threshold (greatest(hang_min_ns, hang_steps x step), parameters of rk_params,
-- or min_open_ns if given).
CREATE OR REPLACE TEMP MACRO rk_open_instances(start_ns, end_ns, cluster, min_open_ns := NULL, job := NULL) AS TABLE
WITH r AS MATERIALIZED (SELECT * FROM rk_failure_rows(start_ns, end_ns, cluster, job := job)),
members AS (
    SELECT cluster_id, job_id, comm_id, list(DISTINCT rank ORDER BY rank) AS members, max(comm_nranks) AS size
    FROM r GROUP BY ALL
),
inst AS (
    SELECT cluster_id, job_id, comm_id, causal_chain_id, any_value(seq) AS seq, any_value(op) AS op,
           min(enter_ns) AS first_enter_ns, list(DISTINCT rank ORDER BY rank) AS entered,
           count(complete_ns) AS completed
    FROM r GROUP BY ALL
),
last_call AS (SELECT cluster_id, job_id, rank, max(enter_ns) AS last_enter_ns FROM r GROUP BY ALL),
exited AS (  -- ranks whose process exited after their last call: gone, not hung
    SELECT DISTINCT l.cluster_id, l.job_id, l.rank
    FROM last_call l JOIN rk_exits(start_ns, NULL, cluster, job := job) e
      ON e.cluster_id = l.cluster_id AND e.job_id = l.job_id AND e.rank = l.rank AND e.exit_ns >= l.last_enter_ns
),
open AS (
    SELECT i.*, m.size, list_filter(m.members, lambda x: NOT list_contains(i.entered, x)) AS absent
    FROM inst i JOIN members m USING (cluster_id, job_id, comm_id)
    WHERE i.completed = 0 AND len(i.entered) < m.size
)
SELECT o.cluster_id, o.job_id, o.comm_id, o.seq, o.causal_chain_id, o.op, o.first_enter_ns, o.size, o.entered,
       list_filter(o.absent, lambda x: NOT list_contains(coalesce(g.gone, []), x)) AS missing,
       list_filter(o.absent, lambda x: list_contains(coalesce(g.gone, []), x)) AS exited,
       o.size - len(o.entered) - len(o.absent) AS unseen,
       coalesce(min_open_ns, greatest(rk_param('hang_min_ns'), rk_param('hang_steps') * coalesce(s.step_ns, 0)))
           AS threshold_ns,
       s.step_ns
FROM open o
LEFT JOIN rk_step_time(start_ns, end_ns, cluster, job := job) s USING (cluster_id, job_id)
LEFT JOIN (SELECT cluster_id, job_id, list(rank) AS gone FROM exited GROUP BY ALL) g USING (cluster_id, job_id);

-- name: rk_hangs
-- Open instances older than their threshold at now_ns whose missing ranks have not exited: the job is
-- stuck waiting for them. open_ns: how long the first rank has waited.
CREATE OR REPLACE TEMP MACRO rk_hangs(start_ns, end_ns, cluster, now_ns, min_open_ns := NULL, job := NULL) AS TABLE
SELECT *, now_ns - first_enter_ns AS open_ns
FROM rk_open_instances(start_ns, end_ns, cluster, min_open_ns := min_open_ns, job := job)
WHERE len(missing) > 0 AND now_ns - first_enter_ns >= threshold_ns;

-- name: rk_crashes
-- Rank exits while the job still needed the rank: a non-zero exit status, or (status unknown or 0) a
-- call of its own left without completion or an instance it was to enter next (step_chain) that other
-- ranks entered. Exits at or after a desync of the cluster are its consequence and left out. first: the
-- earliest such exit of its job (the crash; later ones are usually peers aborting).
CREATE OR REPLACE TEMP MACRO rk_crashes(start_ns, end_ns, cluster, job := NULL) AS TABLE
WITH r AS MATERIALIZED (SELECT * FROM rk_failure_rows(start_ns, end_ns, cluster, job := job)),
e AS (SELECT * FROM rk_exits(start_ns, end_ns, cluster, job := job)),
unfinished AS (SELECT DISTINCT cluster_id, job_id, rank FROM r WHERE complete_ns IS NULL),
entered AS (
    SELECT cluster_id, job_id, causal_chain_id, list(DISTINCT rank ORDER BY rank) AS ranks FROM r GROUP BY ALL
),
desync AS (
    SELECT cluster_id, job_id, min(first_enter_ns) AS at_ns
    FROM rk_desyncs(start_ns, end_ns, cluster, job := job) GROUP BY ALL
),
crashed AS (
    SELECT e.*, coalesce(n.ranks, []) AS entered_by, (u.rank IS NOT NULL) AS left_unfinished
    FROM e
    LEFT JOIN entered n ON n.cluster_id = e.cluster_id AND n.job_id = e.job_id AND n.causal_chain_id = e.step_chain
    LEFT JOIN unfinished u ON u.cluster_id = e.cluster_id AND u.job_id = e.job_id AND u.rank = e.rank
    LEFT JOIN desync d ON d.cluster_id = e.cluster_id AND d.job_id = e.job_id
    WHERE (d.at_ns IS NULL OR e.exit_ns < d.at_ns)
      AND (coalesce(e.status, 0) <> 0 OR u.rank IS NOT NULL
           OR len(list_filter(coalesce(n.ranks, []), lambda x: x <> e.rank)) > 0)
)
SELECT *, row_number() OVER (PARTITION BY cluster_id, job_id ORDER BY exit_ns, rank) = 1 AS first
FROM crashed;
