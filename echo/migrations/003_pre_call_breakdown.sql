-- Schema v3: each collective's pre-call window as the node agent summarised it (agent/window.py,
-- docs/contract.md "Pre-call window"). An agent that summarises sends raw intervals only as evidence,
-- so the analysis reads what the rank's calling thread did before each call from these columns and
-- falls back to host_activity for points without them (older agents). NULL pre_window_ns = not sent;
-- the class columns are then NULL too, otherwise 0 for a class the window did not contain.
ALTER TABLE collectives ADD COLUMN pre_window_ns BIGINT;         -- window length: previous call to enter
ALTER TABLE collectives ADD COLUMN pre_allocator_ns BIGINT;      -- in cudaMalloc/cudaFree
ALTER TABLE collectives ADD COLUMN pre_slow_gpu_ns BIGINT;       -- blocked in its own syncs
ALTER TABLE collectives ADD COLUMN pre_memcpy_ns BIGINT;         -- in blocking copies
ALTER TABLE collectives ADD COLUMN pre_cpu_contention_ns BIGINT; -- runnable, kept off the CPU by other work
ALTER TABLE collectives ADD COLUMN pre_sleeping_ns BIGINT;       -- blocked outside CUDA calls
ALTER TABLE collectives ADD COLUMN pre_presync_ns BIGINT;        -- the GPU rule's sync time (window from a completion)
ALTER TABLE collectives ADD COLUMN launches BIGINT;              -- cudaLaunchKernel calls (a step's first call)
