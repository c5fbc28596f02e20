//! The printed table (nccl-tests' columns and number formats, to the
//! character, so that nccl-tests' parsers read it) and the JSON file of `-J`
//! (for scripts that would rather not parse the table).

use serde::Serialize;

/// One measurement: a row's out-of-place or in-place half.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Meas {
    /// Mean microseconds per call, the largest over ranks.
    pub time_us: f64,
    /// GB/s (1e9 bytes).
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements summed over ranks; `None` without `-c 1`.
    pub wrong: Option<u64>,
}

impl Meas {
    /// nccl-tests' definitions: algbw = size / time, busbw = algbw · factor.
    pub fn new(size: usize, secs: f64, factor: f64, wrong: Option<u64>) -> Meas {
        let algbw = if secs > 0.0 {
            size as f64 / 1e9 / secs
        } else {
            0.0
        };
        Meas {
            time_us: secs * 1e6,
            algbw,
            busbw: algbw * factor,
            wrong,
        }
    }
}

/// One row of the collective table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub dtype: &'static str,
    pub redop: &'static str,
    /// -1 where there is no root.
    pub root: i64,
    /// The all-reduce algorithm that ran (JSON only; the table has no column).
    #[serde(rename = "algorithm")]
    pub algo: Option<&'static str>,
    /// The cost model's predicted time for that algorithm, microseconds.
    pub predicted_us: Option<f64>,
    pub out_of_place: Meas,
    pub in_place: Meas,
}

/// One rank in the header's "Using ranks" list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankLine {
    pub rank: u32,
    pub host: String,
    /// How rank 0 reaches it ("self", "shm", "tcp").
    pub route: String,
}

/// Everything the header block says.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Header {
    /// "allreduce", ..., "p2p".
    pub collective: String,
    #[serde(rename = "world_size")]
    pub world: u32,
    pub transport: String,
    /// `None` for p2p.
    pub algorithm: Option<String>,
    pub datatype: Option<&'static str>,
    pub redop: Option<&'static str>,
    pub root: i64,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step_factor: usize,
    pub iters: usize,
    /// `-T`: each timed loop sized to about this many seconds (`iters` the least).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_s: Option<f64>,
    #[serde(rename = "warmup_iters")]
    pub warmup: usize,
    pub check: bool,
    /// `--hugepages 1`: what the kernel gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<crate::pages::Given>,
    pub ranks: Vec<RankLine>,
}

/// The totals after the last row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Checks (rank × size × placement) that found wrong elements.
    pub out_of_bounds: u64,
    /// Mean busbw over every row and placement (collectives only).
    pub avg_busbw: Option<f64>,
}

pub const COLUMNS: [&str; 3] = [
    "#                                                              out-of-place                       in-place",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
];

/// C's `%g` (six significant digits, trailing zeros dropped).
pub fn fmt_g(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_zeros(mant), exp.abs())
    } else {
        trim_zeros(&format!("{x:.*}", (5 - exp) as usize)).to_string()
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// nccl-tests' time column: 7 wide, 2, 1 or 0 decimals as the value grows.
pub fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn fmt_meas(m: &Meas) -> String {
    let wrong = match m.wrong {
        Some(w) => fmt_g(w as f64),
        None => "N/A".into(),
    };
    format!(
        "  {}  {:6.2}  {:6.2}  {wrong:>5}",
        fmt_time(m.time_us),
        m.algbw,
        m.busbw
    )
}

/// A table row, exactly as nccl-tests prints it.
pub fn row_line(r: &Row) -> String {
    format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}",
        r.size,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        fmt_meas(&r.out_of_place),
        fmt_meas(&r.in_place)
    )
}

/// The cost model's predictions beside the measured out-of-place times, as
/// `#` lines after the table (so the rows keep nccl-tests' columns exactly).
pub fn prediction_lines(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let Some(algo) = r.algo else {
            continue;
        };
        if out.is_empty() {
            out.push(
                "# Cost model (rank 0's α-β-γ): predicted vs measured out-of-place time".into(),
            );
            out.push(format!(
                "# {:>10}  {:>5}  {:>13}  {:>12}  {:>17}",
                "size(B)", "algo", "predicted(us)", "measured(us)", "measured/predicted"
            ));
        }
        // No prediction: a call the host region runs (algo "host").
        let (predicted, ratio) = match r.predicted_us {
            Some(p) if p > 0.0 => (
                format!("{p:.1}"),
                format!("{:.2}", r.out_of_place.time_us / p),
            ),
            Some(p) => (format!("{p:.1}"), "-".into()),
            None => ("-".into(), "-".into()),
        };
        out.push(format!(
            "# {:>10}  {:>5}  {:>13}  {:>12.1}  {:>17}",
            r.size, algo, predicted, r.out_of_place.time_us, ratio
        ));
    }
    out
}

/// The `#` lines before the column header: the run's parameters, transport,
/// algorithm and ranks.
pub fn header_lines(h: &Header) -> Vec<String> {
    let mut v = vec![format!(
        "# gwbench {}  nRanks {} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {}",
        h.collective,
        h.world,
        h.min_bytes,
        h.max_bytes,
        h.step_factor,
        h.warmup,
        h.iters,
        u8::from(h.check)
    )];
    if let Some(t) = h.time_s {
        v[0].push_str(&format!(" timed loops: about {t} s each"));
    }
    v.push(format!("# Transport: {}", h.transport));
    if let Some(g) = &h.hugepages {
        v.push(g.line());
    }
    if let Some(a) = &h.algorithm {
        v.push(format!("# Algorithm: {a}"));
    }
    v.push("#".into());
    v.push("# Using ranks".into());
    for r in &h.ranks {
        v.push(format!(
            "#  Rank {:>2} on {:>10} via {}",
            r.rank, r.host, r.route
        ));
    }
    v.push("#".into());
    v
}

/// The lines after the last row.
pub fn footer_lines(s: &Summary) -> Vec<String> {
    let mut v = vec![format!(
        "# Out of bounds values : {} {}",
        s.out_of_bounds,
        if s.out_of_bounds == 0 { "OK" } else { "FAILED" }
    )];
    if let Some(bw) = s.avg_busbw {
        v.push(format!("# Avg bus bandwidth    : {}", fmt_g(bw)));
    }
    v.push("#".into());
    v
}

/// The p2p table's column header.
pub fn p2p_columns() -> [String; 3] {
    [
        format!(
            "#{:>11}  {:>11}  {:>9}  {:>13}",
            "", "ping-pong", "one-way", "bidirectional"
        ),
        format!(
            "#{:>11}  {:>11}  {:>9}  {:>13}  {:>6}",
            "size", "latency", "bandwidth", "bandwidth", "#wrong"
        ),
        format!(
            "#{:>11}  {:>11}  {:>9}  {:>13}",
            "(B)", "(us)", "(GB/s)", "(GB/s)"
        ),
    ]
}

/// One row of the p2p table.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct P2pRow {
    pub size: usize,
    /// Half the mean round trip, microseconds.
    pub latency_us: f64,
    /// One direction, GB/s.
    pub bw: f64,
    /// Both directions at once, summed, GB/s.
    pub bibw: f64,
    /// Wrong bytes over both ranks; `None` without `-c 1`.
    pub wrong: Option<u64>,
}

pub fn p2p_row_line(r: &P2pRow) -> String {
    let wrong = r.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
    format!(
        "{:>12}  {:>11}  {:>9.2}  {:>13.2}  {:>6}",
        r.size,
        fmt_time(r.latency_us).trim_start(),
        r.bw,
        r.bibw,
        wrong
    )
}

// ---- JSON --------------------------------------------------------------

/// The `-J` file: the header, the rows, then the summary's fields at the top
/// level. serde_json writes NaN and infinities (a zero-time row) as `null`,
/// which JSON readers accept where they would refuse a bare `NaN`.
#[derive(Serialize)]
pub struct Document<'a, R> {
    header: JsonHeader<'a>,
    rows: &'a [R],
    out_of_bounds: u64,
    ok: bool,
    avg_busbw: Option<f64>,
}

/// [`Header`] with the tag that tells gwbench's files from others.
#[derive(Serialize)]
struct JsonHeader<'a> {
    benchmark: &'static str,
    #[serde(flatten)]
    header: &'a Header,
}

/// The `-J` file of a run: `rows` are [`Row`]s or [`P2pRow`]s.
pub fn json<'a, R: Serialize>(h: &'a Header, rows: &'a [R], s: &Summary) -> Document<'a, R> {
    Document {
        header: JsonHeader {
            benchmark: "gwbench",
            header: h,
        },
        rows,
        out_of_bounds: s.out_of_bounds,
        ok: s.out_of_bounds == 0,
        avg_busbw: s.avg_busbw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meas(t: f64, wrong: Option<u64>) -> Meas {
        Meas {
            time_us: t,
            algbw: 1.5,
            busbw: 2.25,
            wrong,
        }
    }

    fn row() -> Row {
        Row {
            size: 1048576,
            count: 262144,
            dtype: "float",
            redop: "sum",
            root: -1,
            algo: Some("ring"),
            predicted_us: Some(100.0),
            out_of_place: meas(123.456, Some(0)),
            in_place: meas(12345.6, Some(3)),
        }
    }

    fn header() -> Header {
        Header {
            collective: "allreduce".into(),
            world: 2,
            transport: "shm".into(),
            algorithm: Some("auto (tree ≤ 65536 B, ring above)".into()),
            datatype: Some("float"),
            redop: Some("sum"),
            root: -1,
            min_bytes: 8,
            max_bytes: 1 << 20,
            step_factor: 2,
            iters: 20,
            time_s: None,
            warmup: 5,
            check: true,
            hugepages: None,
            ranks: vec![
                RankLine {
                    rank: 0,
                    host: "node\"1".into(),
                    route: "self".into(),
                },
                RankLine {
                    rank: 1,
                    host: "node1".into(),
                    route: "shm".into(),
                },
            ],
        }
    }

    #[test]
    fn printf_g() {
        for (x, want) in [
            (0.0, "0"),
            (1.0, "1"),
            (0.5, "0.5"),
            (3.86911234, "3.86911"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (999999.5, "1e+06"),
            (42.0, "42"),
            (1e20, "1e+20"),
        ] {
            assert_eq!(fmt_g(x), want, "{x}");
        }
    }

    #[test]
    fn time_column() {
        assert_eq!(fmt_time(19.684), "  19.68");
        assert_eq!(fmt_time(123.456), "  123.5");
        assert_eq!(fmt_time(12345.6), "  12346");
        assert_eq!(fmt_time(99.999), " 100.00");
        assert_eq!(fmt_time(1234567.0), "1234567");
    }

    #[test]
    fn rows_line_up_with_the_column_header() {
        let line = row_line(&row());
        assert_eq!(
            line,
            "     1048576        262144     float     sum      -1    123.5    1.50    2.25      0    12346    1.50    2.25      3"
        );
        assert_eq!(line.len(), COLUMNS[1].len());
        // Every column ends where its title ends.
        for title in [
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
        ] {
            let end = COLUMNS[1].find(title).unwrap() + title.len();
            assert!(
                line.as_bytes()[end - 1] != b' '
                    && line.as_bytes().get(end).is_none_or(|&b| b == b' '),
                "{title} misaligned:\n{}\n{line}",
                COLUMNS[1]
            );
        }
        let na = Row {
            out_of_place: meas(1.0, None),
            in_place: meas(1.0, None),
            ..row()
        };
        assert!(row_line(&na).ends_with("    N/A"));
        assert_eq!(row_line(&na).len(), COLUMNS[1].len());
    }

    #[test]
    fn predictions_sit_beside_measured_times() {
        let lines = prediction_lines(&[row()]);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].contains("1048576") && lines[2].contains("ring"));
        assert!(lines[2].contains("100.0") && lines[2].contains("123.5"));
        assert!(lines[2].trim_end().ends_with("1.23"), "{}", lines[2]);
        // A call the host region ran: named, with nothing predicted.
        let host = Row {
            algo: Some("host"),
            predicted_us: None,
            ..row()
        };
        let lines = prediction_lines(&[host]);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[2].contains("host") && lines[2].contains("123.5"));
        assert!(lines[2].trim_end().ends_with('-'), "{}", lines[2]);
        // Not an all-reduce: no line.
        let none = Row {
            algo: None,
            predicted_us: None,
            ..row()
        };
        assert!(prediction_lines(&[none]).is_empty());
    }

    #[test]
    fn bandwidth_definitions() {
        let m = Meas::new(1_000_000, 1e-3, 1.5, Some(0));
        assert!((m.algbw - 1.0).abs() < 1e-12);
        assert!((m.busbw - 1.5).abs() < 1e-12);
        assert!((m.time_us - 1000.0).abs() < 1e-9);
        assert_eq!(Meas::new(0, 0.0, 1.0, None).algbw, 0.0);
    }

    #[test]
    fn header_and_footer() {
        let h = header_lines(&header());
        assert!(h[0].starts_with(
            "# gwbench allreduce  nRanks 2 minBytes 8 maxBytes 1048576 step: 2(factor)"
        ));
        assert!(h.contains(&"# Transport: shm".to_string()));
        assert!(h.contains(&"# Algorithm: auto (tree ≤ 65536 B, ring above)".to_string()));
        assert!(h.iter().any(|l| l == "#  Rank  1 on      node1 via shm"));
        assert!(h.iter().all(|l| l.starts_with('#')));
        let ok = footer_lines(&Summary {
            out_of_bounds: 0,
            avg_busbw: Some(3.869112),
        });
        assert_eq!(
            ok,
            [
                "# Out of bounds values : 0 OK",
                "# Avg bus bandwidth    : 3.86911",
                "#"
            ]
        );
        let bad = footer_lines(&Summary {
            out_of_bounds: 2,
            avg_busbw: None,
        });
        assert_eq!(bad, ["# Out of bounds values : 2 FAILED", "#"]);
    }

    /// The `-J` text of a document, as `JsonOut` writes it, and its parse.
    fn written(doc: &impl Serialize) -> (String, serde_json::Value) {
        let text = serde_json::to_string_pretty(doc).expect("serialises");
        let value = serde_json::from_str(&text).expect("is valid JSON");
        (text, value)
    }

    #[test]
    fn json_shape() {
        let s = Summary {
            out_of_bounds: 0,
            avg_busbw: Some(2.25),
        };
        let (text, j) = written(&json(&header(), &[row(), row()], &s));
        let h = &j["header"];
        assert_eq!(h["benchmark"], "gwbench");
        assert_eq!(h["collective"], "allreduce");
        assert_eq!(h["world_size"], 2);
        assert_eq!(h["transport"], "shm");
        assert_eq!(h["algorithm"], "auto (tree ≤ 65536 B, ring above)");
        assert_eq!(
            (&h["datatype"], &h["redop"], &h["root"]),
            (&"float".into(), &"sum".into(), &(-1).into())
        );
        assert_eq!(
            (&h["min_bytes"], &h["max_bytes"], &h["step_factor"]),
            (&8.into(), &(1 << 20).into(), &2.into())
        );
        assert_eq!(
            (&h["iters"], &h["warmup_iters"], &h["check"]),
            (&20.into(), &5.into(), &true.into())
        );
        assert_eq!(
            h["ranks"][0],
            serde_json::json!({"rank": 0, "host": "node\"1", "route": "self"})
        );
        assert_eq!(h["ranks"][1]["route"], "shm");
        // serde_json's map sorts its keys, so the order is checked in the text:
        // the fields come in the order the old writer used.
        let in_order = |keys: &[&str]| {
            let at: Vec<usize> = keys
                .iter()
                .map(|k| text.find(&format!("\"{k}\":")).expect(k))
                .collect();
            assert!(at.is_sorted(), "{keys:?} out of order in\n{text}");
        };
        in_order(&[
            "header",
            "benchmark",
            "collective",
            "world_size",
            "transport",
            "algorithm",
            "datatype",
            "redop",
            "root",
            "min_bytes",
            "max_bytes",
            "step_factor",
            "iters",
            "warmup_iters",
            "check",
            "ranks",
            "rows",
            "out_of_bounds",
            "ok",
            "avg_busbw",
        ]);
        for (k, n) in [
            ("benchmark", 1),
            ("ranks", 1),
            ("out_of_bounds", 1),
            ("size", 2),
        ] {
            assert_eq!(text.matches(&format!("\"{k}\":")).count(), n, "{k}");
        }

        let rows = j["rows"].as_array().expect("rows are a list");
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[0],
            serde_json::json!({
                "size": 1048576, "count": 262144, "type": "float", "redop": "sum", "root": -1,
                "algorithm": "ring", "predicted_us": 100.0,
                "out_of_place": {"time_us": 123.456, "algbw": 1.5, "busbw": 2.25, "wrong": 0},
                "in_place": {"time_us": 12345.6, "algbw": 1.5, "busbw": 2.25, "wrong": 3}
            })
        );
        assert_eq!(
            (&j["out_of_bounds"], &j["ok"], &j["avg_busbw"]),
            (&0.into(), &true.into(), &2.25.into())
        );
        // What the end-to-end tests and existing scripts grep for.
        assert_eq!(text.matches("\"out_of_place\": {").count(), 2, "{text}");
        assert!(text.contains("\"world_size\": 2"), "{text}");

        let unchecked = Row {
            out_of_place: meas(1.0, None),
            predicted_us: None,
            algo: None,
            ..row()
        };
        let (_, u) = written(&json(&header(), &[unchecked], &s));
        assert!(u["rows"][0]["out_of_place"]["wrong"].is_null());
        assert!(u["rows"][0]["algorithm"].is_null());
        assert!(u["rows"][0]["predicted_us"].is_null());
        let (_, empty) = written(&json::<Row>(&header(), &[], &s));
        assert_eq!(empty["rows"], serde_json::json!([]));
        let failed = Summary {
            out_of_bounds: 2,
            avg_busbw: None,
        };
        let (_, f) = written(&json::<Row>(&header(), &[], &failed));
        assert_eq!((&f["out_of_bounds"], &f["ok"]), (&2.into(), &false.into()));
        assert!(f["avg_busbw"].is_null());

        let (_, p) = written(&json(
            &Header {
                collective: "p2p".into(),
                algorithm: None,
                datatype: None,
                redop: None,
                ..header()
            },
            &[P2pRow {
                size: 8,
                latency_us: 3.5,
                bw: 0.25,
                bibw: 0.5,
                wrong: Some(0),
            }],
            &Summary {
                out_of_bounds: 0,
                avg_busbw: None,
            },
        ));
        assert_eq!(
            p["rows"][0],
            serde_json::json!({"size": 8, "latency_us": 3.5, "bw": 0.25, "bibw": 0.5, "wrong": 0})
        );
        assert_eq!(p["header"]["collective"], "p2p");
        assert!(p["header"]["algorithm"].is_null());
        assert!(p["header"]["datatype"].is_null());
        assert!(p["avg_busbw"].is_null());
    }

    #[test]
    fn json_strings_escape_and_non_finite_numbers_are_null() {
        let odd = "a\"b\\c\nd\u{1}é≤";
        let h = Header {
            ranks: vec![RankLine {
                rank: 0,
                host: odd.into(),
                route: "self".into(),
            }],
            ..header()
        };
        let nan = Row {
            out_of_place: Meas {
                time_us: f64::NAN,
                algbw: f64::INFINITY,
                busbw: f64::NEG_INFINITY,
                wrong: None,
            },
            ..row()
        };
        let s = Summary {
            out_of_bounds: 0,
            avg_busbw: Some(f64::NAN),
        };
        let (_, j) = written(&json(&h, &[nan], &s));
        assert_eq!(j["header"]["ranks"][0]["host"], odd);
        let m = &j["rows"][0]["out_of_place"];
        assert!(m["time_us"].is_null() && m["algbw"].is_null() && m["busbw"].is_null());
        assert!(j["avg_busbw"].is_null());
    }

    #[test]
    fn p2p_table_lines_up() {
        let cols = p2p_columns();
        let line = p2p_row_line(&P2pRow {
            size: 65536,
            latency_us: 12.345,
            bw: 1.5,
            bibw: 2.75,
            wrong: Some(0),
        });
        assert_eq!(line.len(), cols[1].len(), "\n{}\n{line}", cols[1]);
        assert_eq!(
            line,
            "       65536        12.35       1.50           2.75       0"
        );
        let na = p2p_row_line(&P2pRow {
            size: 8,
            latency_us: 1.0,
            bw: 0.0,
            bibw: 0.0,
            wrong: None,
        });
        assert!(na.ends_with("   N/A"));
    }
}
