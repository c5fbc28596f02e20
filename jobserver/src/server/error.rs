//! One error type for every request handler, carrying the HTTP status it
//! becomes, so a handler says *what* went wrong once and the router turns it
//! into an [`ErrorBody`](gw_jobapi::types::ErrorBody) reply.

use std::fmt;

/// A request that cannot be served, with the status and message to reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
    /// 400: the request itself is wrong (malformed, absurd, out of range).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
    /// 401: missing or wrong token.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }
    /// 409: well-formed, but not possible in the job's current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, message)
    }
    /// 500: the server's own fault (database, corrupt stored value).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {}: {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<rusqlite::Error> for ApiError {
    fn from(e: rusqlite::Error) -> Self {
        ApiError::internal(format!("database error: {e}"))
    }
}

/// A stored JSON column that no longer decodes: the database was edited or
/// written by an incompatible version.
pub fn corrupt(what: &str, e: impl fmt::Display) -> ApiError {
    ApiError::internal(format!("stored {what} is unreadable: {e}"))
}

pub type ApiResult<T> = Result<T, ApiError>;
