//! `gwjob status` output: plain aligned tables a person reads at a glance
//! (ranks, nodes, local batches, fitted speeds, predicted vs measured step
//! time). Pure formatting, so it is tested without a server.

use crate::server::status::EventLine;
use gw_jobapi::types::{JobState, JobStatus, PlannerKind};

/// Left-aligned columns separated by two spaces; no trailing blanks.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                let w = width.get(i).copied().unwrap_or(0);
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

pub fn state(s: JobState) -> &'static str {
    crate::server::jobs::state_str(s)
}

fn planner(p: PlannerKind) -> &'static str {
    match p {
        PlannerKind::Even => "even",
        PlannerKind::Optperf => "optperf",
    }
}

/// Seconds with a unit that keeps three significant digits readable.
pub fn secs(s: Option<f64>) -> String {
    match s {
        None => "-".into(),
        Some(x) if x < 1e-3 => format!("{:.1} us", x * 1e6),
        Some(x) if x < 1.0 => format!("{:.2} ms", x * 1e3),
        Some(x) => format!("{x:.3} s"),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

/// `gwjob status`: one line per job.
pub fn jobs(list: &[JobStatus]) -> String {
    if list.is_empty() {
        return "no jobs\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|j| {
            vec![
                j.job_id.clone(),
                j.name.clone().unwrap_or_else(|| "-".into()),
                state(j.state).into(),
                j.workers.to_string(),
                planner(j.planner).into(),
                j.global_batch.to_string(),
                opt(j.step),
                secs(j.predicted_step_s),
                secs(j.measured_step_s),
            ]
        })
        .collect();
    render(
        &[
            "JOB",
            "NAME",
            "STATE",
            "WORKERS",
            "PLANNER",
            "BATCH",
            "STEP",
            "PREDICTED",
            "MEASURED",
        ],
        &rows,
    )
}

/// `gwjob status JOB`: the job, its ranks, and its latest events.
pub fn job(j: &JobStatus, events: &[EventLine]) -> String {
    let mut out = format!(
        "job {}{}: {}\n",
        j.job_id,
        j.name
            .as_ref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default(),
        state(j.state)
    );
    if let Some(r) = &j.reason {
        out.push_str(&format!("reason: {r}\n"));
    }
    if let Some(e) = &j.error {
        out.push_str(&format!("error: {e}\n"));
    }
    if j.attempt > 0 || j.preempting {
        out.push_str(&format!(
            "placement {} (from step {}){}\n",
            j.attempt,
            j.resume_step,
            if j.preempting {
                ", being preempted: workers checkpoint and exit"
            } else {
                ""
            }
        ));
    }
    if !j.measured_throughput.is_empty() {
        let m: Vec<String> = j
            .measured_throughput
            .iter()
            .map(|t| format!("{} {:.3}", t.device_type, t.steps_per_s))
            .collect();
        out.push_str(&format!("profiled steps/s: {}\n", m.join(", ")));
    }
    if !j.service.is_empty() {
        let m: Vec<String> = j
            .service
            .iter()
            .map(|t| format!("{} {:.1} s", t.device_type, t.seconds))
            .collect();
        out.push_str(&format!("service: {}\n", m.join(", ")));
    }
    out.push_str(&format!(
        "workers {}, planner {}, global batch {}, last completed step {}\n",
        j.workers,
        planner(j.planner),
        j.global_batch,
        opt(j.step)
    ));
    out.push_str(&format!(
        "step time: predicted {}, measured {}\n",
        secs(j.predicted_step_s),
        secs(j.measured_step_s)
    ));
    out.push_str(&format!(
        "gradient noise scale: {}\n",
        j.noise_scale
            .map_or_else(|| "-".into(), |n| format!("{n:.1}"))
    ));
    if j.ranks.is_empty() {
        out.push_str("ranks: not placed yet\n");
    } else {
        let rows: Vec<Vec<String>> = j
            .ranks
            .iter()
            .map(|r| {
                let speed = match r.fit_a {
                    Some(a) if a > 0.0 => format!("{:.1}", 1.0 / a),
                    _ => "-".into(),
                };
                vec![
                    r.rank.to_string(),
                    r.node.clone(),
                    r.local_batch.to_string(),
                    speed,
                    secs(r.fit_a),
                    secs(r.fit_c),
                    secs(r.last_compute_s),
                    r.exit.map_or_else(|| "-".into(), |e| e.to_string()),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&render(
            &[
                "RANK",
                "NODE",
                "BATCH",
                "SAMPLES/S",
                "FIT A",
                "FIT C",
                "LAST COMPUTE",
                "EXIT",
            ],
            &rows,
        ));
    }
    if !events.is_empty() {
        out.push_str("\nrecent events:\n");
        let start = events.len().saturating_sub(8);
        for e in &events[start..] {
            out.push_str(&format!("  {}\n", e.message));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gw_jobapi::types::RankStatus;

    fn status() -> JobStatus {
        JobStatus {
            job_id: "j1-abc".into(),
            name: Some("demo".into()),
            state: JobState::Running,
            reason: None,
            workers: 2,
            planner: PlannerKind::Optperf,
            global_batch: 64,
            step: Some(7),
            predicted_step_s: Some(0.0512),
            measured_step_s: Some(0.0531),
            noise_scale: Some(123.4),
            ranks: vec![
                RankStatus {
                    rank: 0,
                    node: "n1".into(),
                    local_batch: 48,
                    fit_a: Some(0.001),
                    fit_c: Some(0.0),
                    last_compute_s: Some(0.048),
                    exit: None,
                },
                RankStatus {
                    rank: 1,
                    node: "node-two".into(),
                    local_batch: 16,
                    fit_a: None,
                    fit_c: None,
                    last_compute_s: None,
                    exit: Some(-9),
                },
            ],
            attempt: 0,
            resume_step: 0,
            preempting: false,
            measured_throughput: vec![],
            service: vec![],
            error: None,
        }
    }

    #[test]
    fn job_detail_table() {
        let s = job(&status(), &[]);
        assert!(s.contains("job j1-abc (demo): running"), "{s}");
        assert!(s.contains("predicted 51.20 ms, measured 53.10 ms"), "{s}");
        assert!(s.contains("noise scale: 123.4"), "{s}");
        assert!(!s.contains("placement"), "{s}");
        let mut st = status();
        (st.attempt, st.resume_step, st.preempting) = (2, 340, true);
        let t = job(&st, &[]);
        assert!(
            t.contains("placement 2 (from step 340), being preempted: workers checkpoint and exit"),
            "{t}"
        );
        assert!(!s.contains("profiled"), "{s}");
        st.measured_throughput = vec![
            gw_jobapi::types::DeviceThroughput {
                device_type: "k80".into(),
                steps_per_s: 1.25,
            },
            gw_jobapi::types::DeviceThroughput {
                device_type: "v100".into(),
                steps_per_s: 4.0,
            },
        ];
        let t = job(&st, &[]);
        assert!(
            t.contains("profiled steps/s: k80 1.250, v100 4.000\n"),
            "{t}"
        );
        assert!(!t.contains("service:"), "{t}");
        st.service = vec![gw_jobapi::types::DeviceService {
            device_type: "v100".into(),
            seconds: 720.0,
        }];
        assert!(job(&st, &[]).contains("service: v100 720.0 s\n"));
        let lines: Vec<&str> = s.lines().collect();
        let head = lines.iter().position(|l| l.starts_with("RANK")).unwrap();
        assert_eq!(
            lines[head + 1].split_whitespace().collect::<Vec<_>>(),
            [
                "0", "n1", "48", "1000.0", "1.00", "ms", "0.0", "us", "48.00", "ms", "-"
            ]
        );
        assert!(lines[head + 2].ends_with("-9"));
        // Columns line up: BATCH starts at the same offset in every row.
        let col = lines[head].find("BATCH").unwrap();
        assert_eq!(&lines[head + 1][col..col + 2], "48");
        assert_eq!(&lines[head + 2][col..col + 2], "16");
    }

    #[test]
    fn job_list_table() {
        assert_eq!(jobs(&[]), "no jobs\n");
        let s = jobs(&[status()]);
        assert!(s.starts_with("JOB "));
        assert!(
            s.lines()
                .nth(1)
                .unwrap()
                .starts_with("j1-abc  demo  running  2")
        );
    }
}
