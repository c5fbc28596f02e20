//! Tokens the server issues: one per node (its agent's credential) and
//! named submit tokens (for people and pipelines that run jobs). They exist
//! so that the admin token — which can run any program on every agent —
//! never has to leave the operator: a node that is broken into yields only
//! its own node's token, which can do no more than that node's agent.
//!
//! Only the SHA-256 of each token is stored: a copy of the database (a
//! backup, a stolen disk) then holds no working node or submit credential.
//! A token is 128 random bits, so a fast hash is enough (there is nothing
//! to brute-force), and looking a presented token up by its hash leaks
//! nothing useful through timing: knowing how many leading characters of a
//! hash matched says nothing about the token that would produce it.

use crate::server::db::{event, now};
use crate::server::error::{ApiError, ApiResult};
use crate::server::nodes::check_name;
use gw_jobapi::types::{IssuedToken, Role};
use gw_rendezvous::token::random_hex;
use rusqlite::{OptionalExtension, Transaction, params};
use sha2::{Digest, Sha256};

/// The stored form of `token`.
fn hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A role a token can be issued for: the admin token is configured, never
/// issued.
fn issuable(role: Role) -> ApiResult<&'static str> {
    match role {
        Role::Node | Role::Submit => Ok(role.as_str()),
        Role::Admin => Err(ApiError::bad_request(
            "the admin token is not issued: it is the server's --admin-token-file \
             (or GW_ADMIN_TOKEN, or admin.token beside the database)",
        )),
    }
}

/// Issues a fresh token for `name` in `role`, replacing (and so revoking)
/// any earlier one of the same role and name.
pub fn issue(tx: &Transaction<'_>, role: Role, name: &str) -> ApiResult<IssuedToken> {
    let kind = issuable(role)?;
    check_name(&format!("{kind} token name"), name)?;
    let token =
        random_hex(16).map_err(|e| ApiError::internal(format!("cannot read /dev/urandom: {e}")))?;
    let replaced = tx
        .query_row(
            "SELECT 1 FROM credentials WHERE role = ?1 AND name = ?2",
            params![kind, name],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    tx.execute(
        "INSERT INTO credentials(role, name, hash, issued_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(role, name) DO UPDATE SET hash = excluded.hash, issued_at = excluded.issued_at",
        params![kind, name, hash(&token), now()],
    )?;
    let node = (role == Role::Node).then_some(name);
    let what = if replaced {
        "issued again (the previous one no longer works)"
    } else {
        "issued"
    };
    event(tx, None, node, &format!("{kind} token for {name} {what}"))?;
    Ok(IssuedToken {
        role,
        name: name.to_owned(),
        token,
    })
}

/// Revokes the token of `name` in `role`: 404 if there is none.
pub fn revoke(tx: &Transaction<'_>, role: Role, name: &str) -> ApiResult<()> {
    let kind = issuable(role)?;
    let n = tx.execute(
        "DELETE FROM credentials WHERE role = ?1 AND name = ?2",
        params![kind, name],
    )?;
    if n == 0 {
        return Err(ApiError::not_found(format!("no {kind} token for {name}")));
    }
    let node = (role == Role::Node).then_some(name);
    event(tx, None, node, &format!("{kind} token for {name} revoked"))
}

/// The role and name `token` was issued for, if it is a current issued token.
pub fn lookup(tx: &Transaction<'_>, token: &str) -> ApiResult<Option<(Role, String)>> {
    let row: Option<(String, String)> = tx
        .query_row(
            "SELECT role, name FROM credentials WHERE hash = ?1",
            params![hash(token)],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((role, name)) = row else {
        return Ok(None);
    };
    let role = match role.as_str() {
        "node" => Role::Node,
        "submit" => Role::Submit,
        other => return Err(crate::server::error::corrupt("credential role", other)),
    };
    Ok(Some((role, name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_sha256_in_hex() {
        // The SHA-256 test vector of "abc" (FIPS 180-2).
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
