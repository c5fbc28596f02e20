//! A workload to schedule: one `job` line per job, in the line format of
//! the cluster files.
//!
//! ```text
//! job id=j1 arrival=0 workers=4 steps=20000 batch=512 tput=v100:69.9,p100:45.4,k80:7.0
//! ```
//!
//! `tput` is T[j][k], the job's training steps per second with all its
//! `workers` on device type k (0, or absent, where it does not fit);
//! `batch` is the global batch (samples per step, default 32 per worker);
//! `model` is an optional label. Throughputs for types the cluster lacks
//! are ignored, so one trace serves several clusters.

use crate::cluster::Cluster;
use gw_linefile::{FileError, Line, split};

/// One job of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    pub id: String,
    pub model: Option<String>,
    pub arrival_s: f64,
    pub workers: u32,
    pub steps: u64,
    pub batch: u64,
    /// (device type, steps/s) as written.
    pub tput: Vec<(String, f64)>,
}

/// Jobs in arrival order (ties in file order).
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub jobs: Vec<TraceJob>,
}

/// Largest worker count a job may ask for: far above any real job, low
/// enough that the policies' enumerations stay small.
pub const MAX_WORKERS: u64 = 1024;

impl Trace {
    /// Parses a trace file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Trace, FileError> {
        let mut jobs: Vec<TraceJob> = Vec::new();
        for mut line in split(file, text)? {
            if line.keyword != "job" {
                let what = format!(
                    "unknown keyword `{}` (a trace has `job` lines)",
                    line.keyword
                );
                return Err(line.error(line.keyword, what));
            }
            let job = job(&mut line)?;
            if jobs.iter().any(|j| j.id == job.id) {
                return Err(line.error("id", format!("{} is given to an earlier job", job.id)));
            }
            line.finish()?;
            jobs.push(job);
        }
        if jobs.is_empty() {
            return Err(FileError {
                file: file.into(),
                line: 0,
                field: "job".into(),
                why: "no `job` line: the trace is empty".into(),
            });
        }
        // Stable: equal arrivals keep file order.
        jobs.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        Ok(Trace { jobs })
    }

    /// The text [`Trace::parse`] reads back as this trace.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for j in &self.jobs {
            let tput: Vec<String> = j.tput.iter().map(|(k, t)| format!("{k}:{t}")).collect();
            out += &format!(
                "job id={} arrival={} workers={} steps={} batch={} tput={}",
                j.id,
                j.arrival_s,
                j.workers,
                j.steps,
                j.batch,
                tput.join(",")
            );
            if let Some(m) = &j.model {
                out += &format!(" model={m}");
            }
            out.push('\n');
        }
        out
    }
}

impl TraceJob {
    /// T[j][k] in `cluster`'s type order, 0 for types the trace omits.
    pub fn tput_for(&self, cluster: &Cluster) -> Vec<f64> {
        cluster
            .types
            .iter()
            .map(|t| {
                self.tput
                    .iter()
                    .find(|(k, _)| *k == t.name)
                    .map_or(0.0, |(_, x)| *x)
            })
            .collect()
    }
}

fn job(line: &mut Line<'_>) -> Result<TraceJob, FileError> {
    let id = line.text("id")?.to_owned();
    let model = line.optional_text("model").map(str::to_owned);
    let arrival_s = line.number("arrival", Some(0.0), false)?;
    let workers = line.count("workers", Some(1), 1)?;
    if workers > MAX_WORKERS {
        return Err(line.error("workers", format!("{workers} is above {MAX_WORKERS}")));
    }
    let steps = line.count("steps", None, 1)?;
    let batch = line.count("batch", Some(32 * workers), workers)?;
    let text = line.text("tput")?;
    let mut tput: Vec<(String, f64)> = Vec::new();
    for entry in text.split(',') {
        let Some((k, v)) = entry.split_once(':') else {
            return Err(line.error("tput", format!("{entry:?} is not TYPE:STEPS_PER_S")));
        };
        let x: f64 = v
            .parse()
            .ok()
            .filter(|x: &f64| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| {
                line.error("tput", format!("{v:?} for {k} is not a finite number ≥ 0"))
            })?;
        if k.is_empty() || tput.iter().any(|(seen, _)| seen == k) {
            return Err(line.error("tput", format!("type {k:?} is empty or given twice")));
        }
        tput.push((k.to_owned(), x));
    }
    Ok(TraceJob {
        id,
        model,
        arrival_s,
        workers: workers as u32,
        steps,
        batch,
        tput,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_read_back_and_sort_by_arrival() {
        let text = "job id=b arrival=5 workers=2 steps=10 tput=v100:2,k80:0.5 model=m\n\
                    job id=a arrival=1 steps=7 batch=64 tput=p100:1.5 # late line, early job\n";
        let t = Trace::parse("t", text).expect("a good trace");
        assert_eq!(t.jobs[0].id, "a");
        assert_eq!((t.jobs[0].workers, t.jobs[0].batch), (1, 64));
        assert_eq!(t.jobs[1].batch, 64, "default batch is 32 per worker");
        let c = Cluster::parse("c", "nodes type=k80 count=1\nnodes type=v100 count=1")
            .expect("cluster");
        assert_eq!(t.jobs[1].tput_for(&c), [0.5, 2.0]);
        assert_eq!(t.jobs[0].tput_for(&c), [0.0, 0.0]);
        assert_eq!(Trace::parse("r", &t.render()), Ok(t));
    }

    #[test]
    fn mistakes_name_line_and_field() {
        for (text, line, field) in [
            ("job id=a steps=1 tput=v100:x", 1, "tput"),
            ("job id=a steps=1 tput=v100", 1, "tput"),
            ("job id=a steps=1 tput=v100:-1", 1, "tput"),
            ("job id=a steps=1 tput=v100:1,v100:2", 1, "tput"),
            ("\n\njob id=a steps=0 tput=v100:1", 3, "steps"),
            ("job id=a steps=1 workers=0 tput=v100:1", 1, "workers"),
            ("job id=a steps=1 workers=4 batch=2 tput=v100:1", 1, "batch"),
            ("job id=a steps=1 arrival=-3 tput=v100:1", 1, "arrival"),
            ("job id=a steps=1 tput=v100:1 size=3", 1, "size"),
            ("job steps=1 tput=v100:1", 1, "id"),
            (
                "job id=a steps=1 tput=a:1\njob id=a steps=1 tput=a:1",
                2,
                "id",
            ),
            ("task id=a", 1, "task"),
        ] {
            let e = Trace::parse("t", text).expect_err(text);
            assert_eq!((e.line, e.field.as_str()), (line, field), "{text}: {e}");
        }
    }
}
