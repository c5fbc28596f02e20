//! gwrun's own messages to the person who started it.
//!
//! These are not log lines: they are gwrun's interface, the way a shell
//! tool reports its errors, always printed, each prefixed `gwrun: ` so they
//! stand apart from the ranks' tagged output on the same terminal. One
//! locked write per line keeps them whole beside the output threads.

use std::io::Write;

/// Writes one whole line to stderr.
pub fn line(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.write_all(b"\n");
}

/// `gwrun: ` and the formatted message, as one line on stderr.
macro_rules! say {
    ($($t:tt)*) => {
        $crate::say::line(&format!("gwrun: {}", format_args!($($t)*)))
    };
}
