//! What every `gwjob` subcommand's clap definition shares: the parser of
//! numeric values, and the translation of clap's errors into gwjob's one-line
//! messages.
//!
//! The messages keep the wording gwjob's hand-written parser had ("--workers
//! needs a number, not \"x\"", "unknown option --frob for gwjob serve"),
//! because scripts and people have read them for a while, and because clap's
//! own messages span several lines with a usage block, which is noise in the
//! log of a daemon that failed to start.

use clap::builder::TypedValueParser;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use std::error::Error as _;
use std::ffi::OsStr;
use std::marker::PhantomData;
use std::str::FromStr;

/// A value parser for numbers whose error names the option: `--threads needs
/// a number, not "many"`. A plain `value_parser!(u32)` would say "invalid
/// digit found in string", and a closure cannot know which option it parses.
pub struct Number<T>(PhantomData<fn() -> T>);

/// The [`Number`] parser for type `T`.
pub fn number<T>() -> Number<T> {
    Number(PhantomData)
}

// Derived Clone would require `T: Clone`, which the parser does not need.
impl<T> Clone for Number<T> {
    fn clone(&self) -> Self {
        Number(PhantomData)
    }
}

impl<T> TypedValueParser for Number<T>
where
    T: FromStr + Clone + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let flag = arg
            .and_then(clap::Arg::get_long)
            .map_or_else(|| "the value".to_owned(), |l| format!("--{l}"));
        // Delegating to a closure parser keeps clap's own error shape (a
        // value-validation error whose source is our message).
        let parse = move |v: &str| {
            v.parse::<T>()
                .map_err(|_| format!("{flag} needs a number, not {v:?}"))
        };
        parse.parse_ref(cmd, arg, value)
    }
}

fn context_str(e: &clap::Error, kind: ContextKind) -> Option<&str> {
    match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s),
        _ => None,
    }
}

/// The option an error is about: clap describes it as `--db <PATH>`.
fn flag_of(e: &clap::Error) -> String {
    match context_str(e, ContextKind::InvalidArg) {
        Some(s) => s.split(' ').next().unwrap_or(s).to_owned(),
        None => "an option".to_owned(),
    }
}

/// `a`, `a or b`, `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// gwjob's one-line message for a clap error met while parsing `command`
/// (`gwjob serve`, ...); the caller adds the prefix and the pointer to
/// `--help`.
pub fn message(command: &str, e: &clap::Error) -> String {
    match e.kind() {
        // Our value parsers write whole messages naming their option.
        ErrorKind::ValueValidation if e.source().is_some() => {
            e.source().map(ToString::to_string).unwrap_or_default()
        }
        ErrorKind::InvalidValue => {
            let flag = flag_of(e);
            let value = context_str(e, ContextKind::InvalidValue).unwrap_or_default();
            if value.is_empty() {
                return format!("{flag} needs a value");
            }
            let valid = match e.get(ContextKind::ValidValue) {
                Some(ContextValue::Strings(v)) => or_list(v),
                _ => String::new(),
            };
            format!("{flag} must be {valid}, not {value:?}")
        }
        ErrorKind::UnknownArgument => {
            let arg = context_str(e, ContextKind::InvalidArg).unwrap_or_default();
            if !arg.starts_with('-') {
                return format!("unexpected argument {arg:?}");
            }
            match context_str(e, ContextKind::SuggestedArg) {
                Some(s) => format!("unknown option {arg} for {command} (did you mean {s}?)"),
                None => format!("unknown option {arg} for {command}"),
            }
        }
        // `--json=yes`
        ErrorKind::TooManyValues => format!("{} takes no value", flag_of(e)),
        _ => one_line(e),
    }
}

/// clap's error as one line: its message, notes and tips, without the usage
/// block.
pub fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut line = String::new();
    for part in text.lines().map(str::trim) {
        if part.starts_with("Usage:") || part.starts_with("For more information") {
            break;
        }
        if part.is_empty() {
            continue;
        }
        if !line.is_empty() {
            // "...not provided:" and "[possible values: ...]" continue the
            // line before them; notes and tips are sentences of their own.
            let glue = line.ends_with(':') || part.starts_with('[');
            line.push_str(if glue { " " } else { "; " });
        }
        line.push_str(part.strip_prefix("error: ").unwrap_or(part));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn cmd() -> Command {
        Command::new("t")
            .arg(Arg::new("n").long("n").value_parser(number::<u32>()))
            .arg(Arg::new("kind").long("kind").value_parser(["a", "b"]))
            .arg(
                Arg::new("flag")
                    .long("flag")
                    .action(clap::ArgAction::SetTrue),
            )
    }

    fn e(args: &[&str]) -> String {
        match cmd().try_get_matches_from(std::iter::once("t").chain(args.iter().copied())) {
            Err(e) => message("gwjob t", &e),
            Ok(m) => panic!("{args:?} parsed: {m:?}"),
        }
    }

    #[test]
    fn numbers_name_their_option() {
        let m = cmd()
            .try_get_matches_from(["t", "--n", "7"])
            .expect("a number parses");
        assert_eq!(m.get_one::<u32>("n"), Some(&7));
        assert_eq!(e(&["--n", "abc"]), r#"--n needs a number, not "abc""#);
        assert_eq!(e(&["--n", " 1"]), r#"--n needs a number, not " 1""#);
    }

    #[test]
    fn clap_errors_become_gwjob_lines() {
        assert_eq!(e(&["--n"]), "--n needs a value");
        assert_eq!(e(&["--kind", "c"]), r#"--kind must be a or b, not "c""#);
        assert_eq!(e(&["--frob"]), "unknown option --frob for gwjob t");
        assert_eq!(
            e(&["--fla"]),
            "unknown option --fla for gwjob t (did you mean --flag?)"
        );
        assert_eq!(e(&["pos"]), r#"unexpected argument "pos""#);
        assert_eq!(e(&["--flag=1"]), "--flag takes no value");
        assert_eq!(or_list(&["x".into(), "y".into(), "z".into()]), "x, y or z");
    }
}
