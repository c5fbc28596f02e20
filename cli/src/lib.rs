//! One place for how gradwire's programs report command-line mistakes and
//! print completion scripts.
//!
//! gwrun, gwjob, gwtrain and gwbench all parse their arguments with clap, and
//! all follow the same rules on top of it: a mistake is reported as one line,
//! because clap's several lines with a usage block are noise beside the
//! ranks' interleaved output or in a daemon's log; a value parser's error
//! names the flag it parses; `-h` may be honoured anywhere on the line; and a
//! completion script printed into a pipe that closes early (`| head`) is not
//! a failure. Those rules were written once per program and lived on as
//! copies; here they are written once.
//!
//! The wording is not shared: each program keeps the messages its users and
//! scripts know, and passes what differs (a suffix pointing at `--help`, how
//! a bad number is worded, what to call a flag clap did not name) to these
//! functions.

use clap::builder::TypedValueParser;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Write};
use std::marker::PhantomData;
use std::str::FromStr;

/// The shells [`completion_script`] writes for, as a `value_enum` argument.
pub use clap_complete::Shell;

/// A command-line mistake as one line, which the program prints after its
/// own prefix (`gwrun: error: `).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `Err(UsageError(msg))`.
pub fn err<T>(msg: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(msg.into()))
}

/// clap's error as one line: its message, notes and tips, without the usage
/// block (`--help` has it). Programs add their own pointer to `--help`.
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

/// The message a program's own value parser wrote when `e` is its refusal
/// ([`Number`]'s, or a closure's `Err(String)`): such messages are whole
/// and name their option, so they are shown as they are.
pub fn parser_message(e: &clap::Error) -> Option<String> {
    match e.kind() {
        ErrorKind::ValueValidation => std::error::Error::source(e).map(ToString::to_string),
        _ => None,
    }
}

/// The text clap attached to an error under `kind`, when it is one string.
pub fn context_str(e: &clap::Error, kind: ContextKind) -> Option<&str> {
    match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s),
        _ => None,
    }
}

/// The list clap attached to an error under `kind` (the valid values of
/// [`ContextKind::ValidValue`]); empty when there is none.
pub fn context_strs(e: &clap::Error, kind: ContextKind) -> &[String] {
    match e.get(kind) {
        Some(ContextValue::Strings(v)) => v,
        _ => &[],
    }
}

/// The option an error is about, as the user knows it: clap describes it as
/// `--lanes <K>`, a message wants `--lanes`. `unnamed` stands in when clap
/// names none.
pub fn flag_of(e: &clap::Error, unnamed: &str) -> String {
    match context_str(e, ContextKind::InvalidArg) {
        Some(s) => s.split(' ').next().unwrap_or(s).to_owned(),
        None => unnamed.to_owned(),
    }
}

/// How a [`Number`] words a value that is not a number, given the option as
/// typed (`--steps`) and the value as given.
pub type Complaint = fn(flag: &str, value: &str) -> String;

/// A value parser for numbers whose error names the option (`--threads needs
/// a number, not "many"`), in the program's words. A plain
/// `value_parser!(u32)` would say "invalid digit found in string", and a
/// closure cannot know which option it parses.
pub struct Number<T> {
    complaint: Complaint,
    blanks: bool,
    value: PhantomData<fn() -> T>,
}

/// The [`Number`] parser for type `T`, refusing a value with `complaint`.
/// The value is taken exactly as given unless [`Number::allow_blanks`].
pub fn number<T>(complaint: Complaint) -> Number<T> {
    Number {
        complaint,
        blanks: false,
        value: PhantomData,
    }
}

impl<T> Number<T> {
    /// Lets blanks surround the number (`" 5 "`); the complaint still quotes
    /// the value as given.
    pub fn allow_blanks(self) -> Self {
        Number {
            blanks: true,
            ..self
        }
    }
}

impl<T: FromStr> Number<T> {
    /// Parses `value` given to `flag`, as the parser does; for values that
    /// are parts of one option's value (`--dims 4,8`).
    pub fn parse_str(&self, flag: &str, value: &str) -> Result<T, String> {
        let text = if self.blanks { value.trim() } else { value };
        text.parse().map_err(|_| (self.complaint)(flag, value))
    }
}

// Derived Clone would require `T: Clone`, which the parser does not need.
impl<T> Clone for Number<T> {
    fn clone(&self) -> Self {
        Number {
            complaint: self.complaint,
            blanks: self.blanks,
            value: PhantomData,
        }
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
        // value-validation error whose source is the complaint), which the
        // programs' messages recognise.
        let this = self.clone();
        let parse = move |v: &str| this.parse_str(&flag, v);
        parse.parse_ref(cmd, arg, value)
    }
}

/// The help to print when `-h` or `--help` is anywhere in `args` (without
/// `argv[0]`), even after a mistake, where clap would stop at the mistake.
/// The help is still clap's: `cmd`'s own, or its subcommand's when the first
/// word names one. `None` when neither flag is given.
pub fn help_anywhere(cmd: clap::Command, args: &[OsString]) -> Option<String> {
    let flag = args.iter().find(|a| *a == "-h" || *a == "--help")?;
    let mut argv = vec![OsString::from(cmd.get_name())];
    if let Some(first) = args.first()
        && cmd.find_subcommand(first).is_some()
    {
        argv.push(first.clone());
    }
    argv.push(flag.clone());
    match cmd.try_get_matches_from(argv) {
        // Help is the only "error" clap prints on stdout.
        Err(e) if !e.use_stderr() => Some(e.render().to_string()),
        _ => None,
    }
}

/// The completion script of `cmd` for `shell`, completing the program named
/// as `cmd` is. It is built in memory because clap_complete panics when its
/// writer fails (`gwrun --completions bash | head`); [`print_script`] writes
/// it.
pub fn completion_script(shell: Shell, mut cmd: clap::Command) -> Vec<u8> {
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    script
}

/// Writes `script` to stdout; see [`write_script`].
pub fn print_script(script: &[u8]) -> io::Result<()> {
    write_script(&mut io::stdout(), script)
}

/// Writes `script` to `out`. A reader that had enough (`| head`) closed the
/// pipe: nothing to report, so a broken pipe is success; any other failure is
/// the caller's to report.
pub fn write_script(out: &mut dyn Write, script: &[u8]) -> io::Result<()> {
    match out.write_all(script) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    fn cmd() -> Command {
        Command::new("t")
            .arg(Arg::new("n").long("n").value_parser(number::<u32>(exact)))
            .arg(
                Arg::new("steps")
                    .long("steps")
                    .value_parser(number::<u64>(loose).allow_blanks()),
            )
            .arg(Arg::new("kind").long("kind").value_parser(["a", "b"]))
            .arg(Arg::new("flag").long("flag").action(ArgAction::SetTrue))
            .arg(Arg::new("need").long("need").required(true))
            .subcommand(Command::new("sub").arg(Arg::new("x").long("x")))
    }

    fn exact(flag: &str, v: &str) -> String {
        format!("{flag} needs a number, not {v:?}")
    }

    fn loose(flag: &str, v: &str) -> String {
        format!("{flag} {v:?} is not a valid number")
    }

    fn error(args: &[&str]) -> clap::Error {
        match cmd().try_get_matches_from(std::iter::once("t").chain(args.iter().copied())) {
            Err(e) => e,
            Ok(m) => panic!("{args:?} parsed: {m:?}"),
        }
    }

    /// What the value parser said, as the programs' messages read it.
    fn complaint(args: &[&str]) -> String {
        let e = error(args);
        assert_eq!(e.kind(), ErrorKind::ValueValidation, "{args:?}");
        parser_message(&e).expect("the parser's own message")
    }

    #[test]
    fn numbers_name_their_option() {
        let m = cmd()
            .try_get_matches_from(["t", "--need", "1", "--n", "7", "--steps", " 5 "])
            .expect("numbers parse");
        assert_eq!(m.get_one::<u32>("n"), Some(&7));
        assert_eq!(m.get_one::<u64>("steps"), Some(&5));
        assert_eq!(
            complaint(&["--n", "abc"]),
            r#"--n needs a number, not "abc""#
        );
        assert_eq!(complaint(&["--n", " 1"]), r#"--n needs a number, not " 1""#);
        assert_eq!(
            complaint(&["--steps", " x"]),
            r#"--steps " x" is not a valid number"#
        );
        // A positional has no long name.
        let pos = Command::new("p").arg(Arg::new("v").value_parser(number::<u8>(exact)));
        let e = pos
            .try_get_matches_from(["p", "z"])
            .expect_err("not a number");
        let said = parser_message(&e);
        assert_eq!(
            said.as_deref(),
            Some(r#"the value needs a number, not "z""#)
        );
        // The parts of one option's value.
        let n = number::<usize>(loose).allow_blanks();
        assert_eq!(n.parse_str("--dims", " 4"), Ok(4));
        assert_eq!(
            n.parse_str("--dims", "x"),
            Err(r#"--dims "x" is not a valid number"#.to_owned())
        );
    }

    #[test]
    fn errors_become_one_line() {
        for args in [
            &["--need"][..],
            &[],
            &["--need", "1", "--kind", "c"],
            &["--need", "1", "--bogus"],
            &["--need", "1", "--fla"],
            &["--need", "1", "--flag=1"],
        ] {
            let line = one_line(&error(args));
            assert!(!line.contains('\n'), "{args:?}: {line:?}");
            assert!(!line.starts_with("error:"), "{args:?}: {line:?}");
            assert!(!line.contains("Usage:"), "{args:?}: {line:?}");
            assert!(!line.contains("For more information"), "{args:?}: {line:?}");
        }
        // "...not provided:" continues on the line before it.
        assert_eq!(
            one_line(&error(&[])),
            "the following required arguments were not provided: --need <need>"
        );
        // So do the possible values.
        assert!(
            one_line(&error(&["--need", "1", "--kind", "c"]))
                .ends_with("for '--kind <kind>' [possible values: a, b]"),
        );
        // A tip is a sentence of its own.
        let tip = one_line(&error(&["--need", "1", "--fla"]));
        assert!(
            tip.starts_with("unexpected argument '--fla' found; tip: "),
            "{tip}"
        );
    }

    #[test]
    fn context_of_errors() {
        let e = error(&["--need", "1", "--kind", "c"]);
        assert_eq!(context_str(&e, ContextKind::InvalidValue), Some("c"));
        assert_eq!(context_str(&e, ContextKind::ValidValue), None);
        assert_eq!(context_strs(&e, ContextKind::ValidValue), ["a", "b"]);
        assert_eq!(flag_of(&e, "an option"), "--kind");
        // Only a value parser's refusal has a message of its own.
        assert_eq!(parser_message(&e), None);
        let e = error(&["--need", "1", "--bogus"]);
        assert_eq!(flag_of(&e, "an option"), "--bogus");
        assert!(context_strs(&e, ContextKind::ValidValue).is_empty());
        let e = error(&[]);
        assert_eq!(flag_of(&e, "a flag"), "a flag");
    }

    #[test]
    fn help_anywhere_is_clap_help() {
        let words =
            |s: &str| -> Vec<OsString> { s.split_whitespace().map(OsString::from).collect() };
        let top = cmd().render_help().to_string();
        assert_eq!(help_anywhere(cmd(), &words("-h")), Some(top.clone()));
        assert_eq!(help_anywhere(cmd(), &words("--bogus --help")), Some(top));
        let sub = help_anywhere(cmd(), &words("sub --x --help")).expect("help");
        assert!(
            sub.contains(" sub [OPTIONS]") && sub.contains("--x <x>"),
            "{sub}"
        );
        assert_eq!(help_anywhere(cmd(), &words("--need 1")), None);
        assert_eq!(help_anywhere(cmd(), &[]), None);
    }

    #[test]
    fn completion_scripts() {
        let script = String::from_utf8(completion_script(Shell::Bash, cmd())).expect("text");
        for want in ["_t()", "--steps", "--kind", "sub"] {
            assert!(script.contains(want), "completion lacks {want}\n{script}");
        }
    }

    /// A writer that fails every write with `kind`.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_is_success() {
        let mut out = Vec::new();
        assert!(write_script(&mut out, b"complete -F _t t\n").is_ok());
        assert_eq!(out, b"complete -F _t t\n");
        let broken = write_script(&mut Failing(io::ErrorKind::BrokenPipe), b"x");
        assert!(broken.is_ok(), "{broken:?}");
        let full = write_script(&mut Failing(io::ErrorKind::StorageFull), b"x");
        assert_eq!(full.map_err(|e| e.kind()), Err(io::ErrorKind::StorageFull));
    }

    #[test]
    fn usage_errors() {
        assert_eq!(err::<()>("bad"), Err(UsageError("bad".to_owned())));
        assert_eq!(UsageError("one line".into()).to_string(), "one line");
    }
}
