//! The command lines of `gwjob node-token` and `gwjob token`: the admin's
//! way to hand each agent its own credential and each submitter theirs,
//! instead of copying the admin token onto every node. Both become one
//! [`Client::Issue`] or [`Client::Revoke`]: `node-token --node N` is
//! `token --role node --name N`, kept as its own command because it is the
//! one every node's setup needs.

use crate::cli::args::{Client, Conn};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueHint};
use gw_jobapi::types::Role;
use std::path::PathBuf;

pub const NODE_TOKEN_AFTER_HELP: &str = "\
Issues the token a node's agent runs with (gwjob agent --token-file FILE).
It lets the agent register and heartbeat as that node and nothing else.
Issuing again replaces the node's token; the old one stops working.
Needs the admin token.";

pub const TOKEN_AFTER_HELP: &str = "\
A submit token submits jobs and reads, cancels and re-batches every job,
but cannot act as a node or issue tokens. Jobs run as the agents' user on
the nodes, so a submit token can run any program there. Issuing again
under the same name replaces the old token. Needs the admin token.";

/// What `node-token` and `token` share: revoking instead of issuing, where
/// an issued token goes (a new private file, or stdout), and the server.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Revoke the token of this name instead
    #[arg(long, value_name = "NAME", allow_hyphen_values = true)]
    revoke: Option<String>,

    /// Write the token to this new file, readable by its owner only,
    /// instead of printing it
    #[arg(long, value_name = "PATH", allow_hyphen_values = true, value_hint = ValueHint::FilePath)]
    out: Option<PathBuf>,

    #[command(flatten)]
    conn: Conn,
}

/// `gwjob node-token`'s flags.
#[derive(Args, Clone, Debug)]
pub struct NodeTokenArgs {
    /// The node to issue a token for (its agent's --node)
    #[arg(
        long,
        value_name = "NAME",
        allow_hyphen_values = true,
        conflicts_with = "revoke"
    )]
    node: Option<String>,

    #[command(flatten)]
    common: Common,
}

/// `gwjob token`'s flags.
#[derive(Args, Clone, Debug)]
pub struct TokenArgs {
    /// What the token may do
    #[arg(long, value_name = "ROLE", default_value = "submit", value_parser = role_parser())]
    role: Role,

    /// The token's name (for a node token, the node's name)
    #[arg(
        long,
        value_name = "NAME",
        allow_hyphen_values = true,
        conflicts_with = "revoke"
    )]
    name: Option<String>,

    #[command(flatten)]
    common: Common,
}

impl NodeTokenArgs {
    pub fn request(self) -> Result<Client, String> {
        self.common.request(Role::Node, "--node", self.node)
    }
}

impl TokenArgs {
    pub fn request(self) -> Result<Client, String> {
        self.common.request(self.role, "--name", self.name)
    }
}

impl Common {
    /// Issue `name` (given as `flag`) in `role`, or revoke.
    fn request(self, role: Role, flag: &str, name: Option<String>) -> Result<Client, String> {
        let Common { revoke, out, conn } = self;
        match (name, revoke) {
            (Some(name), None) => Ok(Client::Issue {
                conn,
                role,
                name,
                out,
            }),
            (None, Some(name)) if out.is_none() => Ok(Client::Revoke { conn, role, name }),
            (None, Some(_)) => Err("--out goes with issuing a token, not with --revoke".into()),
            _ => Err(format!("{flag} NAME (or --revoke NAME) is required")),
        }
    }
}

fn role_parser() -> impl TypedValueParser<Value = Role> {
    PossibleValuesParser::new(["submit", "node"]).map(|s| match s.as_str() {
        "node" => Role::Node,
        _ => Role::Submit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::command::{Gwjob, parse};

    fn p(a: &[&str]) -> Result<Client, String> {
        match parse(a.iter().map(Into::into), None) {
            Ok(Gwjob::Client(c)) => Ok(c),
            Ok(other) => panic!("{a:?}: {other:?}"),
            Err(e) => Err(e.message),
        }
    }

    #[test]
    fn node_token_is_a_node_role_token() {
        let issue = |role, name: &str, out: Option<&str>| Client::Issue {
            conn: Conn::default(),
            role,
            name: name.into(),
            out: out.map(PathBuf::from),
        };
        assert_eq!(
            p(&["node-token", "--node", "n1"]),
            Ok(issue(Role::Node, "n1", None))
        );
        assert_eq!(
            p(&["token", "--role", "node", "--name", "n1", "--out", "f"]),
            Ok(issue(Role::Node, "n1", Some("f")))
        );
        assert_eq!(
            p(&["token", "--name", "ci"]),
            Ok(issue(Role::Submit, "ci", None))
        );
        assert_eq!(
            p(&["node-token", "--revoke", "n1"]),
            Ok(Client::Revoke {
                conn: Conn::default(),
                role: Role::Node,
                name: "n1".into()
            })
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (a, want) in [
            (
                &["node-token"][..],
                "--node NAME (or --revoke NAME) is required",
            ),
            (&["token"][..], "--name NAME (or --revoke NAME) is required"),
            (
                &["token", "--role", "admin", "--name", "x"][..],
                "submit or node",
            ),
            (
                &["node-token", "--node", "a", "--revoke", "b"][..],
                "--revoke",
            ),
            (&["node-token", "--revoke", "a", "--out", "f"][..], "--out"),
        ] {
            let e = p(a).expect_err("a mistake");
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
