//! The line format that perfmodel's model and cluster files and the
//! scheduler's trace and cluster files share, so that every bad field is
//! reported as `FILE line N, field F: why` by one piece of code.
//!
//! A line is a keyword followed by `key=value` fields; `#` starts a comment
//! and blank lines are skipped. Every field a keyword knows must be read
//! through [`Fields`], which rejects unknown and repeated keys and parses
//! numbers with the line and field in the message.

use std::fmt;

/// A bad line file: where, which field, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct FileError {
    pub file: String,
    /// 1-based; 0 when the problem is the file as a whole (a line missing).
    pub line: usize,
    pub field: String,
    pub why: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}: {}", self.file, self.field, self.why)
        } else {
            write!(
                f,
                "{} line {}, field `{}`: {}",
                self.file, self.line, self.field, self.why
            )
        }
    }
}

impl std::error::Error for FileError {}

/// One non-empty line: its keyword and its fields, still unread.
pub struct Line<'a> {
    pub no: usize,
    pub keyword: &'a str,
    file: &'a str,
    fields: Vec<(&'a str, &'a str, bool)>,
}

/// The non-empty lines of `text`, or the first line that is not
/// `keyword key=value…`.
pub fn split<'a>(file: &'a str, text: &'a str) -> Result<Vec<Line<'a>>, FileError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let body = raw.split('#').next().unwrap_or("").trim();
        let mut words = body.split_whitespace();
        let Some(keyword) = words.next() else {
            continue;
        };
        let mut fields: Vec<(&str, &str, bool)> = Vec::new();
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                return Err(FileError {
                    file: file.into(),
                    line: i + 1,
                    field: w.into(),
                    why: "is not key=value".into(),
                });
            };
            if fields.iter().any(|f| f.0 == k) {
                return Err(FileError {
                    file: file.into(),
                    line: i + 1,
                    field: k.into(),
                    why: "given twice".into(),
                });
            }
            fields.push((k, v, false));
        }
        out.push(Line {
            no: i + 1,
            keyword,
            file,
            fields,
        });
    }
    Ok(out)
}

impl<'a> Line<'a> {
    /// An error about `field` on this line.
    pub fn error(&self, field: &str, why: impl Into<String>) -> FileError {
        FileError {
            file: self.file.into(),
            line: self.no,
            field: field.into(),
            why: why.into(),
        }
    }

    fn take(&mut self, key: &str) -> Option<&'a str> {
        let f = self.fields.iter_mut().find(|f| f.0 == key)?;
        f.2 = true;
        Some(f.1)
    }

    /// The text of `key`, which must be present.
    pub fn text(&mut self, key: &str) -> Result<&'a str, FileError> {
        match self.take(key) {
            Some(v) if !v.is_empty() => Ok(v),
            Some(_) => Err(self.error(key, "is empty")),
            None => Err(self.error(key, "is missing")),
        }
    }

    /// The text of `key` if present.
    pub fn optional_text(&mut self, key: &str) -> Option<&'a str> {
        self.take(key)
    }

    /// A finite number ≥ 0 (> 0 when `positive`), present or `default`.
    pub fn number(
        &mut self,
        key: &str,
        default: Option<f64>,
        positive: bool,
    ) -> Result<f64, FileError> {
        let Some(v) = self.take(key) else {
            return default.ok_or_else(|| self.error(key, "is missing"));
        };
        let x: f64 = v
            .parse()
            .map_err(|_| self.error(key, format!("{v:?} is not a number")))?;
        if !x.is_finite() || x < 0.0 || (positive && x == 0.0) {
            let want = if positive { "> 0" } else { "≥ 0" };
            return Err(self.error(key, format!("{v} is not a finite number {want}")));
        }
        Ok(x)
    }

    /// A whole number ≥ `min`, present or `default`.
    pub fn count(&mut self, key: &str, default: Option<u64>, min: u64) -> Result<u64, FileError> {
        let Some(v) = self.take(key) else {
            return default.ok_or_else(|| self.error(key, "is missing"));
        };
        let x: u64 = v
            .parse()
            .map_err(|_| self.error(key, format!("{v:?} is not a whole number")))?;
        if x < min {
            return Err(self.error(key, format!("{x} is below {min}")));
        }
        Ok(x)
    }

    /// A whole number ≥ `min` if present.
    pub fn optional_count(&mut self, key: &str, min: u64) -> Result<Option<u64>, FileError> {
        match self.fields.iter().any(|f| f.0 == key) {
            true => self.count(key, None, min).map(Some),
            false => Ok(None),
        }
    }

    /// Ok once every field has been read; else names the first unknown one.
    pub fn finish(self) -> Result<(), FileError> {
        match self.fields.iter().find(|f| !f.2) {
            Some(f) => Err(self.error(f.0, format!("unknown field for a `{}` line", self.keyword))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_once_and_strays_are_named() {
        let text = "# comment\n\nlink alpha=1e-6 gbps=200 # trailing\nx a=1 a=2\n";
        let e = split("f", text).err().expect("a repeated key");
        assert_eq!((e.line, e.field.as_str()), (4, "a"));
        let mut lines = split("f", "link alpha=1e-6 gbps=200 colour=red").expect("lines");
        let mut l = lines.remove(0);
        assert_eq!(l.keyword, "link");
        assert_eq!(l.number("alpha", None, false).ok(), Some(1e-6));
        assert_eq!(l.count("gbps", None, 1).ok(), Some(200));
        let e = l.finish().expect_err("colour is unknown");
        assert_eq!(
            e.to_string(),
            "f line 1, field `colour`: unknown field for a `link` line"
        );
    }

    #[test]
    fn bad_numbers_name_line_and_field() {
        let mut l = split("m", "\nlayer params=12x flops=-1 n=0 e= inf=inf")
            .expect("lines")
            .remove(0);
        let e = l.count("params", None, 0).expect_err("12x");
        assert_eq!(
            e.to_string(),
            "m line 2, field `params`: \"12x\" is not a whole number"
        );
        assert!(l.number("flops", None, false).is_err());
        assert!(
            l.count("n", None, 1)
                .expect_err("0 < 1")
                .why
                .contains("below 1")
        );
        assert!(l.text("e").expect_err("empty").why.contains("empty"));
        assert!(l.number("inf", None, false).is_err());
        assert!(
            l.number("absent", None, false)
                .expect_err("missing")
                .why
                .contains("missing")
        );
        assert_eq!(l.number("absent", Some(2.0), true).ok(), Some(2.0));
        let e = split("m", "layer params").err().expect("no =");
        assert_eq!((e.line, e.why.as_str()), (1, "is not key=value"));
    }
}
