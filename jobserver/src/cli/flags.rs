//! The few lines of command-line scanning every `gwjob` subcommand shares:
//! `--name VALUE` or `--name=VALUE`, positionals, and `--` (everything after
//! it is returned as is). Like gwrun, no argument-parsing crate: the grammar
//! is tiny and we want exactly this behaviour and these messages.

use std::collections::VecDeque;

/// One word of the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// `--name` or `-x`, with the `=VALUE` part if written inline.
    Flag(String, Option<String>),
    Positional(String),
    /// `--`: the rest belongs to someone else.
    End,
}

pub struct Flags {
    args: VecDeque<String>,
}

impl Flags {
    pub fn new(args: Vec<String>) -> Flags {
        Flags { args: args.into() }
    }

    pub fn next_item(&mut self) -> Option<Item> {
        let a = self.args.pop_front()?;
        if a == "--" {
            return Some(Item::End);
        }
        if a.starts_with("--") {
            return Some(match a.split_once('=') {
                Some((n, v)) => Item::Flag(n.to_owned(), Some(v.to_owned())),
                None => Item::Flag(a, None),
            });
        }
        if a.starts_with('-') && a.len() > 1 {
            return Some(Item::Flag(a, None));
        }
        Some(Item::Positional(a))
    }

    /// The value of flag `name`: the inline one, or the next word.
    pub fn value(&mut self, name: &str, inline: Option<String>) -> Result<String, String> {
        match inline {
            Some(v) => Ok(v),
            None => self
                .args
                .pop_front()
                .ok_or_else(|| format!("{name} needs a value")),
        }
    }

    /// The value of `name` parsed as a number of type T.
    pub fn number<T: std::str::FromStr>(
        &mut self,
        name: &str,
        inline: Option<String>,
    ) -> Result<T, String> {
        let v = self.value(name, inline)?;
        v.parse()
            .map_err(|_| format!("{name} needs a number, not {v:?}"))
    }

    /// Everything not consumed yet.
    pub fn rest(&mut self) -> Vec<String> {
        self.args.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_flags_values_and_the_rest() {
        let mut f = Flags::new(
            ["--a", "1", "--b=2", "-h", "pos", "--", "x", "--y"]
                .map(String::from)
                .to_vec(),
        );
        assert_eq!(f.next_item(), Some(Item::Flag("--a".into(), None)));
        assert_eq!(f.number::<u32>("--a", None), Ok(1));
        let Some(Item::Flag(n, v)) = f.next_item() else {
            panic!()
        };
        assert_eq!(f.value(&n, v), Ok("2".into()));
        assert_eq!(f.next_item(), Some(Item::Flag("-h".into(), None)));
        assert_eq!(f.next_item(), Some(Item::Positional("pos".into())));
        assert_eq!(f.next_item(), Some(Item::End));
        assert_eq!(f.rest(), vec!["x", "--y"]);
        assert_eq!(f.next_item(), None);
        assert_eq!(f.value("--z", None), Err("--z needs a value".into()));
        let mut g = Flags::new(vec!["abc".into()]);
        assert!(g.number::<u32>("--n", None).unwrap_err().contains("abc"));
    }
}
