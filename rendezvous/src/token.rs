//! Job secrets: the store token, job ids, the job server's tokens.
//!
//! Every secret gradwire makes comes from the kernel's random source, so that
//! a launcher, a job server and the C ABI cannot differ in how guessable
//! their tokens are.

use std::fs::File;
use std::io::{self, Read};

/// `n` bytes from /dev/urandom, as lowercase hex.
pub fn random_hex(n: usize) -> io::Result<String> {
    let mut buf = vec![0u8; n];
    File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids() {
        let a = random_hex(16).unwrap();
        let b = random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
        assert_eq!(random_hex(8).unwrap().len(), 16);
    }
}
