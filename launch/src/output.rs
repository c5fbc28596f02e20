//! Tagging rank output with `[RANK] `.
//!
//! One thread per pipe (two per rank) is the simplest design that never lets
//! one chatty rank block another: each thread reads its pipe, cuts it into
//! lines, and writes every whole line, prefix included, with a single locked
//! write to gwrun's own stdout or stderr, so lines from different ranks never
//! interleave mid-line. Bytes are passed through as they are (no UTF-8
//! decoding). A last line without a newline is flushed at EOF with one added,
//! and a "line" longer than [`MAX_LINE`] is cut into tagged pieces, so memory
//! stays bounded whatever a rank prints.
//!
//! When gwrun's own output fails (a closed `| head`), the thread keeps reading
//! and discards, so that the rank never blocks on a full pipe.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

/// The longest piece written without a newline of its own.
pub const MAX_LINE: usize = 64 * 1024;

/// Which of gwrun's streams a pipe goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Reads `src` to EOF and calls `emit` with each tagged line (prefix, bytes,
/// and a trailing newline). After `emit` fails once it is not called again,
/// but `src` is still drained.
pub fn pump(prefix: &[u8], src: impl Read, mut emit: impl FnMut(&[u8]) -> io::Result<()>) {
    let mut r = BufReader::with_capacity(MAX_LINE, src);
    let mut line = Vec::with_capacity(prefix.len() + 256);
    line.extend_from_slice(prefix);
    let mut broken = false;
    let mut send = |line: &mut Vec<u8>| {
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if !broken && emit(line).is_err() {
            broken = true;
        }
        line.truncate(prefix.len());
    };
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => &[],
        };
        if avail.is_empty() {
            if line.len() > prefix.len() {
                send(&mut line);
            }
            return;
        }
        let room = MAX_LINE - (line.len() - prefix.len());
        let take = &avail[..avail.len().min(room)];
        match take.iter().position(|&b| b == b'\n') {
            Some(i) => {
                line.extend_from_slice(&take[..=i]);
                r.consume(i + 1);
                send(&mut line);
            }
            None => {
                let n = take.len();
                line.extend_from_slice(take);
                r.consume(n);
                if line.len() - prefix.len() >= MAX_LINE {
                    send(&mut line);
                }
            }
        }
    }
}

/// The prefix for `rank`.
pub fn prefix(rank: usize) -> Vec<u8> {
    format!("[{rank}] ").into_bytes()
}

/// Starts a thread forwarding `src` to gwrun's `stream` with `rank`'s prefix.
/// The thread holds `done` until it finishes, so the receiving end sees
/// "disconnected" once every forwarder has drained its pipe.
pub fn forward(
    rank: usize,
    src: impl Read + Send + 'static,
    stream: Stream,
    done: Sender<()>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("gwrun-out-{rank}"))
        .spawn(move || {
            let p = prefix(rank);
            match stream {
                Stream::Stdout => pump(&p, src, |l| {
                    let mut out = io::stdout().lock();
                    out.write_all(l)?;
                    out.flush()
                }),
                Stream::Stderr => pump(&p, src, |l| io::stderr().lock().write_all(l)),
            }
            drop(done);
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(input: &[u8]) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        pump(b"[3] ", input, |l| {
            got.push(l.to_vec());
            Ok(())
        });
        got
    }

    #[test]
    fn lines_are_prefixed() {
        assert_eq!(tag(b"a\nbc\n\n"), [&b"[3] a\n"[..], b"[3] bc\n", b"[3] \n"]);
        assert!(tag(b"").is_empty());
    }

    #[test]
    fn partial_last_line_gets_a_newline() {
        assert_eq!(
            tag(b"a\nno-newline"),
            [&b"[3] a\n"[..], b"[3] no-newline\n"]
        );
    }

    #[test]
    fn bytes_pass_through() {
        assert_eq!(tag(b"\xff\xfe\r\x00\n"), [&b"[3] \xff\xfe\r\x00\n"[..]]);
    }

    #[test]
    fn long_lines_are_cut() {
        let mut input = vec![b'x'; MAX_LINE * 2 + 10];
        input.push(b'\n');
        let got = tag(&input);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].len(), 4 + MAX_LINE + 1);
        assert_eq!(got[1].len(), 4 + MAX_LINE + 1);
        assert_eq!(got[2], b"[3] xxxxxxxxxx\n");
    }

    /// A reader that hands out its bytes a few at a time, as a pipe does.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(3);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn lines_split_across_reads() {
        let mut got = Vec::new();
        pump(b"[0] ", Trickle(b"hello world\nsecond line\ntail"), |l| {
            got.push(String::from_utf8(l.to_vec()).unwrap());
            Ok(())
        });
        assert_eq!(
            got,
            ["[0] hello world\n", "[0] second line\n", "[0] tail\n"]
        );
    }

    #[test]
    fn failing_sink_still_drains() {
        let mut calls = 0;
        let mut src: &[u8] = b"a\nb\nc\n";
        pump(b"", &mut src, |_| {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        });
        assert_eq!(calls, 1);
        assert!(src.is_empty());
    }
}
