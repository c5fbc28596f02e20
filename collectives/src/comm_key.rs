//! Which communicator a rank is bringing up: the name its store keys,
//! shared-memory segments and data-plane id are derived from.
//!
//! Ranks meet in a communicator by using the same key. A key is a name plus
//! the ordinal of that name in this process (`world-0`, `world-1`, ...), so
//! communicators with different names meet whatever order, and from whatever
//! threads, ranks create them in; only communicators of the same name must be
//! created in the same order on every rank, as MPI requires of every
//! communicator. The C ABI's unique id names its communicator exactly.

use gw_rendezvous::launch_env::sanitize;
use gw_transport::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;

/// The name [`crate::Communicator::from_env`] uses.
pub const DEFAULT_NAME: &str = "world";

/// How many communicators of each name this process has created.
static ORDINALS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// The key of one communicator.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CommKey(String);

impl CommKey {
    /// The next communicator named `name` in this process: `name-0` the
    /// first time, `name-1` the next, and so on. The ordinal is the part
    /// after the last `-`, so no two names share a key.
    pub fn next(name: &str) -> Result<CommKey> {
        let clean = check_name(name)?;
        let mut g = ORDINALS.lock().unwrap_or_else(|p| p.into_inner());
        let n = g
            .get_or_insert_with(HashMap::new)
            .entry(clean.clone())
            .or_insert(0);
        let key = CommKey(format!("{clean}-{n}"));
        *n += 1;
        Ok(key)
    }

    /// Exactly `key`, for callers that make keys unique themselves (the C
    /// ABI's unique id, tests that bring up many worlds in one process).
    pub fn exact(key: &str) -> Result<CommKey> {
        Ok(CommKey(check_name(key)?))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CommKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Keys go into file names and store keys: only `[A-Za-z0-9_-]`, 1 to 64 of them.
fn check_name(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "communicator name {name:?}: use 1 to 64 of A-Z a-z 0-9 - _ (got {:?} after cleaning)",
            sanitize(name)
        )));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_numbered_each_on_its_own() {
        let a0 = CommKey::next("keytest-a").unwrap();
        let b0 = CommKey::next("keytest-b").unwrap();
        let a1 = CommKey::next("keytest-a").unwrap();
        assert_eq!(
            (a0.as_str(), b0.as_str(), a1.as_str()),
            ("keytest-a-0", "keytest-b-0", "keytest-a-1")
        );
        assert_eq!(CommKey::exact("u1f").unwrap().as_str(), "u1f");
    }

    #[test]
    fn unusable_names_are_refused_by_name() {
        for bad in ["", "a/b", "x y", "a.b", &"n".repeat(65)] {
            let e = CommKey::next(bad).unwrap_err().to_string();
            assert!(e.contains("communicator name"), "{e}");
        }
    }
}
