//! Helpers shared by the multi-process tests.
