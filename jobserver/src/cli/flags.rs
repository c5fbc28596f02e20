//! What every `gwjob` subcommand's clap definition shares: the parser of
//! numeric values, and the translation of clap's errors into gwjob's one-line
//! messages. The mechanics are [`gw_cli`]'s; the wording is gwjob's.
//!
//! The messages keep the wording gwjob's hand-written parser had ("--workers
//! needs a number, not \"x\"", "unknown option --frob for gwjob serve"),
//! because scripts and people have read them for a while, and because clap's
//! own messages span several lines with a usage block, which is noise in the
//! log of a daemon that failed to start.

use clap::error::{ContextKind, ErrorKind};
use gw_cli::{Number, context_str, context_strs, flag_of, parser_message};

/// A value parser for numbers whose error names the option: `--threads needs
/// a number, not "many"` (see [`gw_cli::Number`]).
pub fn number<T>() -> Number<T> {
    gw_cli::number(|flag, v| format!("{flag} needs a number, not {v:?}"))
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
    // Our value parsers write whole messages naming their option.
    if let Some(m) = parser_message(e) {
        return m;
    }
    match e.kind() {
        ErrorKind::InvalidValue => {
            let flag = flag_of(e, "an option");
            let value = context_str(e, ContextKind::InvalidValue).unwrap_or_default();
            if value.is_empty() {
                return format!("{flag} needs a value");
            }
            let valid = or_list(context_strs(e, ContextKind::ValidValue));
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
        ErrorKind::TooManyValues => format!("{} takes no value", flag_of(e, "an option")),
        _ => gw_cli::one_line(e),
    }
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
