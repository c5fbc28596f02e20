//! The C ABI over gw-allreduce (issue 5).
