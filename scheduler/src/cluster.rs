//! The cluster a schedule is made for: how many slots (one worker each,
//! e.g. one GPU) of each device type it has. The live server builds the
//! same thing from its node inventory; the simulator reads it from a
//! cluster file:
//!
//! ```text
//! # type, nodes of that type, slots per node
//! nodes type=v100 count=9 slots=4
//! nodes type=p100 count=9 slots=4
//! ```
//!
//! Several lines may name one type (nodes with different slot counts);
//! types keep the order of their first line, which is the order of every
//! per-type vector in this crate.

use gw_linefile::{FileError, split};

/// One device type and how much of it the cluster has.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceType {
    pub name: String,
    pub nodes: u32,
    /// Slots over all nodes of this type.
    pub slots: u32,
}

/// Device types in a fixed order.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub types: Vec<DeviceType>,
}

impl Cluster {
    /// Parses a cluster file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Cluster, FileError> {
        let mut types: Vec<DeviceType> = Vec::new();
        for mut line in split(file, text)? {
            if line.keyword != "nodes" {
                let what = format!(
                    "unknown keyword `{}` (a cluster file has `nodes` lines)",
                    line.keyword
                );
                return Err(line.error(line.keyword, what));
            }
            let name = line.text("type")?;
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(line.error(
                    "type",
                    format!("{name:?} is not a name of letters, digits, - and _"),
                ));
            }
            let count = line.count("count", None, 1)?;
            let slots = line.count("slots", Some(1), 1)?;
            let total = count
                .checked_mul(slots)
                .filter(|t| *t <= u64::from(u32::MAX / 2));
            let Some(total) = total else {
                return Err(line.error(
                    "slots",
                    format!("{count} nodes × {slots} slots is too many"),
                ));
            };
            line.finish()?;
            let (count, total) = (count as u32, total as u32);
            match types.iter_mut().find(|t| t.name == name) {
                Some(t) => match t.slots.checked_add(total).filter(|s| *s <= u32::MAX / 2) {
                    Some(s) => {
                        t.slots = s;
                        t.nodes = t.nodes.saturating_add(count);
                    }
                    None => {
                        return Err(line_error(
                            file,
                            "slots",
                            "too many slots in all for one type",
                        ));
                    }
                },
                None => types.push(DeviceType {
                    name: name.to_owned(),
                    nodes: count,
                    slots: total,
                }),
            }
        }
        if types.is_empty() {
            return Err(line_error(
                file,
                "nodes",
                "no `nodes` line: the cluster is empty",
            ));
        }
        Ok(Cluster { types })
    }

    /// The text [`Cluster::parse`] reads back as this cluster, one line per
    /// type, its slots spread evenly over its nodes where they divide.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for t in &self.types {
            if t.nodes > 0 && t.slots % t.nodes == 0 {
                out += &format!(
                    "nodes type={} count={} slots={}\n",
                    t.name,
                    t.nodes,
                    t.slots / t.nodes
                );
            } else {
                out += &format!("nodes type={} count={} slots=1\n", t.name, t.slots);
            }
        }
        out
    }

    /// Slots of each type, in type order.
    pub fn slots(&self) -> Vec<u32> {
        self.types.iter().map(|t| t.slots).collect()
    }

    pub fn names(&self) -> Vec<&str> {
        self.types.iter().map(|t| t.name.as_str()).collect()
    }
}

/// An error about the whole file rather than one line.
fn line_error(file: &str, field: &str, why: &str) -> FileError {
    FileError {
        file: file.into(),
        line: 0,
        field: field.into(),
        why: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_add_up_in_first_seen_order() {
        let c = Cluster::parse(
            "c",
            "nodes type=v100 count=2 slots=4\nnodes type=k80 count=3 # one slot each\nnodes type=v100 count=1 slots=8\n",
        )
        .expect("a good cluster");
        assert_eq!(c.names(), ["v100", "k80"]);
        assert_eq!(c.slots(), [16, 3]);
        assert_eq!(c.types[0].nodes, 3);
        let again = Cluster::parse("r", &c.render()).expect("rendered text parses");
        assert_eq!(again.slots(), c.slots());
    }

    #[test]
    fn mistakes_name_line_and_field() {
        for (text, line, field) in [
            ("nodes type=v100 count=0", 1, "count"),
            ("\nnodes type=v100 count=2 slots=x", 2, "slots"),
            ("nodes count=2", 1, "type"),
            ("nodes type=a/b count=2", 1, "type"),
            ("nodes type=a count=2 colour=red", 1, "colour"),
            ("gpus type=a count=2", 1, "gpus"),
            ("nodes type=a count=4294967295 slots=4294967295", 1, "slots"),
        ] {
            let e = Cluster::parse("c", text).expect_err(text);
            assert_eq!((e.line, e.field.as_str()), (line, field), "{text}: {e}");
        }
        let e = Cluster::parse("c", "# nothing\n").expect_err("empty");
        assert!(e.to_string().contains("the cluster is empty"), "{e}");
    }
}
