//! `gwjob serve`: the job server (being built).
