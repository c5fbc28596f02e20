//! The job server's only durable state: one SQLite database in WAL mode.
//!
//! Everything a restarted server needs (nodes, racks, jobs with their specs
//! and tokens, the hashes of issued node and submit tokens, rank placement
//! and launch delivery, per-step plans, step reports, per-rank timing fits,
//! the noise-scale estimator, events) is a row here, and every request
//! changes it in one `BEGIN IMMEDIATE` transaction, so a `kill -9` at any
//! instant leaves either the whole change or none of it.
//! The only in-memory state is the time each node last heartbeated, which
//! deliberately restarts from zero with the server (see `nodes.rs`), and
//! a scheduling policy's bookkeeping (`rounds.rs`).
//!
//! A job's placements under a scheduling policy live in `job_attempts`, a
//! table of its own so that a database of an older server opens unchanged
//! (no row: the first placement, never preempted).

use crate::server::error::{ApiError, ApiResult};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde::Serialize;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bumped whenever the schema changes incompatibly; a database written by a
/// different version is refused instead of misread. (A new table is not an
/// incompatible change: `CREATE TABLE IF NOT EXISTS` adds it to an older
/// database when it is opened.)
pub const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS racks (
    name TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS nodes (
    name        TEXT PRIMARY KEY,
    rack        TEXT NOT NULL REFERENCES racks(name),
    slots       INTEGER NOT NULL,
    device_type TEXT NOT NULL,
    addr        TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('up', 'lost')),
    reason      TEXT,
    reg_seq     INTEGER NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    name            TEXT,
    spec            TEXT NOT NULL,
    workers         INTEGER NOT NULL,
    planner         TEXT NOT NULL,
    state           TEXT NOT NULL
                    CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    reason          TEXT,
    job_token       TEXT NOT NULL,
    store_token     TEXT NOT NULL,
    store_addr      TEXT,
    completed_step  INTEGER,
    noise           TEXT,
    submitted_at    REAL NOT NULL,
    ended_at        REAL
);
CREATE TABLE IF NOT EXISTS job_attempts (
    job_id       TEXT PRIMARY KEY REFERENCES jobs(id),
    attempt      INTEGER NOT NULL DEFAULT 0,
    resume_step  INTEGER NOT NULL DEFAULT 0,
    preempt      INTEGER NOT NULL DEFAULT 0,
    preempt_step INTEGER,
    want         TEXT
);
CREATE TABLE IF NOT EXISTS job_profile (
    job_id      TEXT NOT NULL REFERENCES jobs(id),
    device_type TEXT NOT NULL,
    steps_per_s REAL NOT NULL,
    PRIMARY KEY (job_id, device_type)
);
CREATE TABLE IF NOT EXISTS job_service (
    job_id      TEXT NOT NULL REFERENCES jobs(id),
    device_type TEXT NOT NULL,
    seconds     REAL NOT NULL,
    PRIMARY KEY (job_id, device_type)
);
CREATE TABLE IF NOT EXISTS batch_changes (
    job_id       TEXT NOT NULL REFERENCES jobs(id),
    step         INTEGER NOT NULL,
    global_batch INTEGER NOT NULL,
    source       TEXT NOT NULL,
    PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS ranks (
    job_id         TEXT NOT NULL REFERENCES jobs(id),
    rank           INTEGER NOT NULL,
    node           TEXT NOT NULL REFERENCES nodes(name),
    launched       INTEGER NOT NULL DEFAULT 0,
    exited         INTEGER NOT NULL DEFAULT 0,
    exit_code      INTEGER,
    exit_signal    INTEGER,
    released       INTEGER NOT NULL DEFAULT 0,
    fit            TEXT NOT NULL,
    last_compute_s REAL,
    PRIMARY KEY (job_id, rank)
);
CREATE INDEX IF NOT EXISTS ranks_by_node ON ranks(node, released);
CREATE TABLE IF NOT EXISTS plans (
    job_id           TEXT NOT NULL REFERENCES jobs(id),
    step             INTEGER NOT NULL,
    global_batch     INTEGER NOT NULL,
    batches          TEXT NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('even', 'optperf')),
    basis            TEXT,
    predicted_step_s REAL,
    algo             TEXT NOT NULL,
    PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS step_ends (
    job_id         TEXT NOT NULL REFERENCES jobs(id),
    step           INTEGER NOT NULL,
    rank           INTEGER NOT NULL,
    samples        INTEGER NOT NULL,
    compute_s      REAL NOT NULL,
    comm_s         REAL NOT NULL,
    step_s         REAL NOT NULL,
    local_grad_sq  REAL,
    global_grad_sq REAL,
    PRIMARY KEY (job_id, step, rank)
);
CREATE TABLE IF NOT EXISTS steps (
    job_id          TEXT NOT NULL REFERENCES jobs(id),
    step            INTEGER NOT NULL,
    measured_step_s REAL NOT NULL,
    comm_s          REAL NOT NULL,
    PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    job_id  TEXT,
    node    TEXT,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE TABLE IF NOT EXISTS credentials (
    role       TEXT NOT NULL CHECK (role IN ('node', 'submit')),
    name       TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    issued_at  REAL NOT NULL,
    PRIMARY KEY (role, name)
);
";

/// The database behind one lock: requests are small, so serialising them is
/// simpler than any finer scheme and costs nothing measurable.
pub struct Db {
    conn: Mutex<Connection>,
}

impl Db {
    /// Opens (creating if needed) the database at `path` and its schema.
    pub fn open(path: &Path) -> Result<Db, String> {
        // The database holds every job's tokens: readable by its owner only
        // (SQLite gives the -wal and -shm files the same mode).
        if path.exists() {
            crate::server::auth::check_private(path, "database")?;
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| format!("cannot create database {}: {e}", path.display()))?;
        }
        let conn = Connection::open(path)
            .map_err(|e| format!("cannot open database {}: {e}", path.display()))?;
        Self::init(conn).map_err(|e| format!("database {}: {e}", path.display()))
    }

    fn init(conn: Connection) -> Result<Db, String> {
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| format!("cannot enable WAL: {e}"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(format!("cannot enable WAL (journal mode is {mode})"));
        }
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
            .map_err(|e| e.to_string())?;
        conn.execute_batch(SCHEMA)
            .map_err(|e| format!("cannot create schema: {e}"))?;
        let stored: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        match stored {
            None => {
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )
                .map_err(|e| e.to_string())?;
            }
            Some(v) if v == SCHEMA_VERSION.to_string() => {}
            Some(v) => {
                return Err(format!(
                    "schema version {v}, this gwjob understands {SCHEMA_VERSION}"
                ));
            }
        }
        Ok(Db {
            conn: Mutex::new(conn),
        })
    }

    /// Runs `f` in one immediate transaction: committed if `f` succeeds,
    /// rolled back (nothing stored) if it returns an error.
    pub fn tx<T>(&self, f: impl FnOnce(&Transaction<'_>) -> ApiResult<T>) -> ApiResult<T> {
        // A panic while holding the lock cannot leave a half-applied change
        // (the transaction rolls back on drop), so a poisoned lock is usable.
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()
            .map_err(|e| ApiError::internal(format!("database commit failed: {e}")))?;
        Ok(out)
    }
}

/// Seconds since the Unix epoch, for timestamps in rows.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Appends one line to the event log (and to stderr, for the operator).
pub fn event(
    tx: &Transaction<'_>,
    job_id: Option<&str>,
    node: Option<&str>,
    message: &str,
) -> ApiResult<()> {
    tx.execute(
        "INSERT INTO events(at, job_id, node, message) VALUES (?1, ?2, ?3, ?4)",
        params![now(), job_id, node, message],
    )?;
    tracing::info!("{message}");
    Ok(())
}

/// Serialising our own values cannot fail in practice; if it does, it is a
/// server bug reported as a 500 rather than a panic.
pub fn to_json<T: Serialize + ?Sized>(v: &T) -> ApiResult<String> {
    serde_json::to_string(v).map_err(|e| ApiError::internal(format!("cannot encode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_is_created_and_version_checked() {
        let dir = std::env::temp_dir().join(format!("gw-db-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("a.db");
        let _ = std::fs::remove_file(&path);
        {
            let db = Db::open(&path).unwrap();
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            db.tx(|tx| {
                tx.execute(
                    "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
                    [],
                )?;
                Ok(())
            })
            .unwrap();
        }
        let err = Db::open(&path).err().unwrap();
        assert!(err.contains("schema version 99"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failed_transaction_stores_nothing() {
        let dir = std::env::temp_dir().join(format!("gw-db-test2-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("b.db");
        let _ = std::fs::remove_file(&path);
        let db = Db::open(&path).unwrap();
        let r: ApiResult<()> = db.tx(|tx| {
            tx.execute("INSERT INTO racks(name) VALUES ('r1')", [])?;
            Err(ApiError::bad_request("no"))
        });
        assert!(r.is_err());
        let n: i64 = db
            .tx(|tx| Ok(tx.query_row("SELECT COUNT(*) FROM racks", [], |r| r.get(0))?))
            .unwrap();
        assert_eq!(n, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn in_memory_database_is_refused() {
        // An in-memory database cannot be WAL (nor survive a restart).
        assert!(Db::init(Connection::open_in_memory().unwrap()).is_err());
    }
}
