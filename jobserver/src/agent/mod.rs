//! `gwjob agent`: runs a node's workers (being built).
