//! Who signed a request, and whether that role may call the endpoint. Kept
//! in one place so the rule for each role can be read, and tested, at once:
//!
//! | caller            | jobs (submit, status, cancel) | node calls       | tokens |
//! |-------------------|-------------------------------|------------------|--------|
//! | admin token       | yes                           | any node         | yes    |
//! | submit token      | yes (every job)               | no               | no     |
//! | node token for N  | no                            | as node N only   | no     |
//!
//! A token that is none of these is a 401; a known token used beyond its
//! role is a 403 that names the role and what it may do instead. Workers'
//! job tokens are checked by the step endpoints themselves (`steps.rs`).

use crate::server::auth;
use crate::server::credentials;
use crate::server::error::{ApiError, ApiResult};
use crate::server::routes::Auth;
use gw_jobapi::types::Role;
use rusqlite::Transaction;

/// The holder of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// A submit token, by the name it was issued under.
    Submit(String),
    /// The token of this node.
    Node(String),
}

impl Principal {
    pub fn role(&self) -> Role {
        match self {
            Principal::Admin => Role::Admin,
            Principal::Submit(_) => Role::Submit,
            Principal::Node(_) => Role::Node,
        }
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Principal::Admin => write!(f, "the admin token"),
            Principal::Submit(n) => write!(f, "submit token {n}"),
            Principal::Node(n) => write!(f, "the token of node {n}"),
        }
    }
}

/// Who holds `token`: the admin, or the holder of a current issued token.
pub fn identify(tx: &Transaction<'_>, admin_token: &str, token: &str) -> ApiResult<Principal> {
    if auth::same(token, admin_token) {
        return Ok(Principal::Admin);
    }
    match credentials::lookup(tx, token)? {
        Some((Role::Node, name)) => Ok(Principal::Node(name)),
        Some((Role::Submit, name)) => Ok(Principal::Submit(name)),
        Some((Role::Admin, _)) | None => Err(ApiError::unauthorized(
            "unknown token: this endpoint needs the admin token, a submit token or a node token",
        )),
    }
}

fn forbidden(message: String) -> ApiError {
    ApiError::new(403, message)
}

/// Whether `who` may call an endpoint of class `need`. A `Job` endpoint
/// takes only its job's worker token, which is no principal: refused here.
pub fn allow(who: &Principal, need: Auth<'_>) -> ApiResult<()> {
    match (who, need) {
        (_, Auth::Job(id)) => Err(ApiError::unauthorized(format!(
            "no job {id} with this worker token"
        ))),
        (Principal::Admin, _) => Ok(()),
        (Principal::Submit(_), Auth::Submit) => Ok(()),
        (Principal::Node(_), Auth::Node(None)) => Ok(()),
        (Principal::Node(mine), Auth::Node(Some(node))) => as_node(who, mine, node),
        (Principal::Submit(_), Auth::Node(_)) => Err(forbidden(format!(
            "{who} cannot act as a node agent: an agent needs its node's token \
             (gwjob node-token --node NAME)"
        ))),
        (Principal::Node(_), Auth::Submit) => Err(forbidden(format!(
            "{who} may only register and heartbeat as that node; \
             submitting, reading or cancelling jobs needs a submit token"
        ))),
        (_, Auth::Admin) => Err(forbidden(format!(
            "{who} cannot issue or revoke tokens: only the admin token can"
        ))),
    }
}

/// A node call on behalf of `node` (from the path, or from the body of a
/// registration, then checked as `Auth::Node(Some(node))` once decoded) is
/// allowed to the admin and to `node`'s own token.
fn as_node(who: &Principal, mine: &str, node: &str) -> ApiResult<()> {
    if mine == node {
        return Ok(());
    }
    Err(forbidden(format!(
        "{who} cannot act as node {node}: a node token is good for its own node only"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_reaches_exactly_its_endpoints() {
        let admin = Principal::Admin;
        let ci = Principal::Submit("ci".into());
        let n1 = Principal::Node("n1".into());
        let status =
            |who: &Principal, need| allow(who, need).map(|_| 200).unwrap_or_else(|e| e.status);
        for need in [
            Auth::Admin,
            Auth::Submit,
            Auth::Node(None),
            Auth::Node(Some("n2")),
        ] {
            assert_eq!(status(&admin, need), 200, "{need:?}");
        }
        assert_eq!(status(&ci, Auth::Submit), 200);
        assert_eq!(status(&ci, Auth::Node(None)), 403);
        assert_eq!(status(&ci, Auth::Node(Some("n1"))), 403);
        assert_eq!(status(&ci, Auth::Admin), 403);
        assert_eq!(status(&n1, Auth::Node(Some("n1"))), 200);
        assert_eq!(status(&n1, Auth::Node(None)), 200);
        assert_eq!(status(&n1, Auth::Node(Some("n2"))), 403);
        assert_eq!(status(&n1, Auth::Submit), 403);
        assert_eq!(status(&n1, Auth::Admin), 403);
        for who in [&admin, &ci, &n1] {
            assert_eq!(status(who, Auth::Job("j1")), 401);
        }
        let e = allow(&n1, Auth::Node(Some("n2"))).unwrap_err().message;
        assert!(e.contains("node n1") && e.contains("node n2"), "{e}");
    }
}
