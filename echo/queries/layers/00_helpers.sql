-- Layer 0: small scalar macros the analysis layers and the explain queries share.

-- name: rk_activity_category
-- What an interval of a rank's thread (host_activity) counts as when explaining lateness:
-- 'allocator' (cudaMalloc/cudaFree), 'slow_gpu' (blocked in its own sync: its GPU was busy),
-- 'memcpy' (a copy), 'cpu_contention' (off the CPU while runnable, pushed off by another workload),
-- 'sleeping' (off the CPU, blocked, outside a CUDA call: data loader, I/O, locks); NULL for an
-- off-CPU interval inside one of those calls (the call's own interval already counts it) and for one
-- where a thread of a traced process took the CPU (the node's ranks competing for its cores: host
-- compute, like what no interval covers).
CREATE OR REPLACE TEMP MACRO rk_activity_category(kind, cuda_call, state, preempted_by) AS
CASE WHEN kind IN ('malloc', 'free') THEN 'allocator'
     WHEN kind = 'sync' THEN 'slow_gpu'
     WHEN kind = 'memcpy' THEN 'memcpy'
     WHEN cuda_call IN ('cudaMalloc', 'cudaFree', 'cudaMemcpy', 'cudaStreamSynchronize',
                        'cudaDeviceSynchronize', 'cudaEventSynchronize') THEN NULL
     WHEN state = 'preempted' AND preempted_by = 'job' THEN NULL
     WHEN state = 'preempted' THEN 'cpu_contention'
     ELSE 'sleeping' END;
