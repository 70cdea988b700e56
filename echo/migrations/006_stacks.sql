-- Schema v6: call stacks (docs/stacks.md). An agent ships each distinct stack once per node as a
-- rankecho.stack point and afterwards cites it by id (rankecho.stack.id, a content hash of the frames:
-- equal stacks have equal ids on every node). `stacks` holds one row per id; the typed tables carry the
-- ids their points cited. A cited id with no row yet (the stack point may arrive after the events that
-- cite it, or retention dropped it) simply finds nothing: every reader joins it with LEFT JOIN.
CREATE TABLE stacks (
    stack_id      VARCHAR PRIMARY KEY, -- 16 hex digits (rankecho.shared.stacks.stack_id of the frames)
    frames        VARCHAR[] NOT NULL,  -- innermost (callee) first: 'cudaMalloc', 'train.py:forward:88'
    depth         INTEGER NOT NULL,    -- len(frames)
    truncated     BOOLEAN NOT NULL,    -- the walk stopped early (no frame pointers, depth cap)
    first_seen_ns BIGINT NOT NULL,     -- the stack point's timestamp (node clock, Unix ns)
    cluster_id    VARCHAR,
    node_id       VARCHAR              -- the node whose point stored it first
);
-- The stack at the collective's enter, and per cause class of the pre-call breakdown the stack that
-- carried the most of that class's time in the window; the on-CPU sampler's most seen stack (host
-- compute) with its sample count.
ALTER TABLE collectives ADD COLUMN stack_id VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_allocator_stack VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_slow_gpu_stack VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_memcpy_stack VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_cpu_contention_stack VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_sleeping_stack VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_oncpu_stack VARCHAR;
ALTER TABLE collectives ADD COLUMN pre_oncpu_samples BIGINT;
-- The stack at a long CUDA call's entry or an off-CPU switch-out.
ALTER TABLE host_activity ADD COLUMN stack_id VARCHAR;
-- Existing rows: from events' attrs_json (a store migrating from v1 is staged afterwards with the
-- current staging.sql, which fills everything itself).
INSERT INTO stacks
SELECT DISTINCT ON (stack_id) stack_id, frames, len(frames), truncated, first_seen_ns, cluster_id, node_id
FROM (
    SELECT json_extract_string(attrs_json, '$."rankecho.stack.id"') AS stack_id,
           string_split(json_extract_string(attrs_json, '$."rankecho.stack.frames"'), chr(10)) AS frames,
           coalesce(TRY_CAST(json_extract_string(attrs_json, '$."rankecho.stack.truncated"') AS BOOLEAN), false)
               AS truncated,
           timestamp_ns AS first_seen_ns, cluster_id, node_id
    FROM events WHERE metric_name = 'rankecho.stack'
)
WHERE stack_id IS NOT NULL AND frames IS NOT NULL AND frames <> ['']
ORDER BY stack_id, first_seen_ns;
UPDATE collectives SET
    stack_id = a[1], pre_allocator_stack = a[2], pre_slow_gpu_stack = a[3], pre_memcpy_stack = a[4],
    pre_cpu_contention_stack = a[5], pre_sleeping_stack = a[6], pre_oncpu_stack = a[7],
    pre_oncpu_samples = TRY_CAST(a[8] AS BIGINT)
FROM (
    SELECT event_id, json_extract_string(attrs_json, [
               '$."rankecho.stack.id"', '$."rankecho.pre.allocator_stack"', '$."rankecho.pre.slow_gpu_stack"',
               '$."rankecho.pre.memcpy_stack"', '$."rankecho.pre.cpu_contention_stack"',
               '$."rankecho.pre.sleeping_stack"', '$."rankecho.pre.oncpu_stack"', '$."rankecho.pre.oncpu_samples"'
           ]) AS a
    FROM events WHERE metric_name = 'rankecho.nccl.collective'
) e
WHERE e.event_id = collectives.event_id;
UPDATE host_activity SET stack_id = json_extract_string(e.attrs_json, '$."rankecho.stack.id"')
FROM events e
WHERE e.event_id = CASE WHEN host_activity.kind = 'runq' THEN left(host_activity.event_id, length(host_activity.event_id) - 5)
                        ELSE host_activity.event_id END;
