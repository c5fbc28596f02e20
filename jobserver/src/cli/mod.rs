//! `gwjob submit|status|cancel` (being built).
