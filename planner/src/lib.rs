//! OptPerf, the step planner: pure computation, no I/O, so the job server,
//! tests and benchmarks drive it the same way.
