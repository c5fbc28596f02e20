//! Model files: what one training sample of a network costs, and the
//! gradient it produces, layer by layer in backward order.
//!
//! ```text
//! model name=resnet50 params=25557032
//! sample read_bytes=110000 input_bytes=602112 activation_bytes=103000000
//! train batch_per_device=32 dataset_samples=1281167
//! measured device=v100 batch=64 samples_per_s=281.27
//! layer name=fc.bias params=1000 flops=2000
//! ```
//!
//! `flops` are the forward FLOPs of one sample through that layer; the
//! backward pass costs `backward_flops` (default twice the forward, one
//! product for the input gradient and one for the weight gradient).
//! `measured` lines give real per-device-type speeds and win over FLOP
//! counts for that device type. `params` on the `model` line, when given,
//! must equal the layers' sum, so that a file cannot silently lose a layer.

use crate::lines::{FileError, Line, split};
use gw_planner::Linear;

/// One gradient tensor, in backward order (the first is ready first).
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub name: String,
    pub params: u64,
    pub forward_flops: f64,
    pub backward_flops: f64,
}

/// A measured training speed on one device type at one local batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub device: String,
    pub batch: u64,
    pub samples_per_s: f64,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub name: String,
    pub layers: Vec<Layer>,
    /// Bytes per gradient element.
    pub grad_bytes: u64,
    /// Optimizer state per parameter (momentum: 4, Adam: 8), besides the
    /// weight and its gradient.
    pub state_bytes_per_param: u64,
    /// Memory traffic of the optimizer step per parameter.
    pub update_bytes_per_param: f64,
    /// Bytes read from storage per sample (a JPEG, a token file slice).
    pub read_bytes: f64,
    /// Bytes copied host to device per sample (the decoded tensor).
    pub input_bytes: f64,
    /// Activation memory per sample kept for the backward pass.
    pub activation_bytes: f64,
    pub batch_per_device: u64,
    pub dataset_samples: u64,
    pub measured: Vec<Measured>,
}

impl Workload {
    pub fn params(&self) -> u64 {
        self.layers.iter().map(|l| l.params).sum()
    }

    pub fn gradient_bytes(&self) -> u64 {
        self.params() * self.grad_bytes
    }

    pub fn forward_flops(&self) -> f64 {
        self.layers.iter().map(|l| l.forward_flops).sum()
    }

    pub fn backward_flops(&self) -> f64 {
        self.layers.iter().map(|l| l.backward_flops).sum()
    }

    /// Memory a device needs before any sample: weights, gradients and
    /// optimizer state.
    pub fn static_bytes(&self) -> f64 {
        self.params() as f64 * (2 * self.grad_bytes + self.state_bytes_per_param) as f64
    }

    /// The forward+backward time per step on `device` fitted from the
    /// measured lines, `t(b) = a·b + c`, if there are any: least squares
    /// over the batches measured, through the origin when only one batch is
    /// known or the fit's intercept would be negative.
    pub fn measured_fit(&self, device: &str) -> Option<Linear> {
        let pts: Vec<(f64, f64)> = self
            .measured
            .iter()
            .filter(|m| m.device == device)
            .map(|m| (m.batch as f64, m.batch as f64 / m.samples_per_s))
            .collect();
        if pts.is_empty() {
            return None;
        }
        let n = pts.len() as f64;
        let (sb, st) = pts.iter().fold((0.0, 0.0), |(a, b), p| (a + p.0, b + p.1));
        let (mb, mt) = (sb / n, st / n);
        let sxx: f64 = pts.iter().map(|p| (p.0 - mb) * (p.0 - mb)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mb) * (p.1 - mt)).sum();
        if sxx > 0.0 {
            let a = sxy / sxx;
            let c = mt - a * mb;
            if a >= 0.0 && c >= 0.0 {
                return Some(Linear { a, c });
            }
        }
        let sbb: f64 = pts.iter().map(|p| p.0 * p.0).sum();
        let sbt: f64 = pts.iter().map(|p| p.0 * p.1).sum();
        Some(Linear {
            a: sbt / sbb,
            c: 0.0,
        })
    }

    /// Parses a model file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Workload, FileError> {
        let whole = |field: &str, why: &str| FileError {
            file: file.into(),
            line: 0,
            field: field.into(),
            why: why.into(),
        };
        let mut name = None;
        let mut declared: Option<(u64, usize)> = None;
        let mut w = Workload {
            name: String::new(),
            layers: Vec::new(),
            grad_bytes: 4,
            state_bytes_per_param: 4,
            update_bytes_per_param: 20.0,
            read_bytes: 0.0,
            input_bytes: 0.0,
            activation_bytes: 0.0,
            batch_per_device: 32,
            dataset_samples: 0,
            measured: Vec::new(),
        };
        let mut seen = (false, false);
        for mut l in split(file, text)? {
            match l.keyword {
                "model" => {
                    if name.is_some() {
                        return Err(l.error("model", "a second `model` line"));
                    }
                    name = Some(l.text("name")?.to_string());
                    if let Some(p) = l.optional_count("params", 1)? {
                        declared = Some((p, l.no));
                    }
                }
                "sample" => {
                    once(&mut seen.0, &l)?;
                    w.read_bytes = l.number("read_bytes", Some(0.0), false)?;
                    w.input_bytes = l.number("input_bytes", Some(0.0), false)?;
                    w.activation_bytes = l.number("activation_bytes", Some(0.0), false)?;
                }
                "train" => {
                    once(&mut seen.1, &l)?;
                    w.batch_per_device = l.count("batch_per_device", Some(32), 1)?;
                    w.dataset_samples = l.count("dataset_samples", None, 1)?;
                    w.grad_bytes = l.count("grad_bytes", Some(4), 1)?;
                    w.state_bytes_per_param = l.count("state_bytes_per_param", Some(4), 0)?;
                    w.update_bytes_per_param =
                        l.number("update_bytes_per_param", Some(20.0), false)?;
                }
                "measured" => {
                    let device = l.text("device")?.to_string();
                    let batch = l.count("batch", None, 1)?;
                    let samples_per_s = l.number("samples_per_s", None, true)?;
                    w.measured.push(Measured {
                        device,
                        batch,
                        samples_per_s,
                        line: l.no,
                    });
                }
                "layer" => {
                    let name = l.text("name")?.to_string();
                    let params = l.count("params", None, 0)?;
                    let forward_flops = l.number("flops", Some(0.0), false)?;
                    let backward_flops =
                        l.number("backward_flops", Some(2.0 * forward_flops), false)?;
                    w.layers.push(Layer {
                        name,
                        params,
                        forward_flops,
                        backward_flops,
                    });
                }
                other => {
                    return Err(l.error(
                        other,
                        "unknown line (model, sample, train, measured or layer)",
                    ));
                }
            }
            l.finish()?;
        }
        w.name = name.ok_or_else(|| whole("model", "no `model name=…` line"))?;
        if !seen.1 {
            return Err(whole("train", "no `train dataset_samples=…` line"));
        }
        if w.params() == 0 {
            return Err(whole("layer", "no layer has parameters"));
        }
        if let Some((p, line)) = declared
            && p != w.params()
        {
            return Err(FileError {
                file: file.into(),
                line,
                field: "params".into(),
                why: format!("{p} declared, but the layers hold {}", w.params()),
            });
        }
        if w.forward_flops() == 0.0 && w.measured.is_empty() {
            return Err(whole(
                "layer",
                "no layer has FLOPs and no `measured` line gives a speed",
            ));
        }
        Ok(w)
    }
}

fn once(seen: &mut bool, l: &Line) -> Result<(), FileError> {
    if std::mem::replace(seen, true) {
        return Err(l.error(l.keyword, format!("a second `{}` line", l.keyword)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "model name=two params=30\ntrain dataset_samples=100\n\
                       layer name=b params=10 flops=5\nlayer name=a params=20 flops=15 backward_flops=40\n";

    #[test]
    fn layers_sum_and_defaults_apply() {
        let w = Workload::parse("two", TWO).expect("parses");
        assert_eq!(w.params(), 30);
        assert_eq!(w.gradient_bytes(), 120);
        assert_eq!(w.forward_flops(), 20.0);
        assert_eq!(w.backward_flops(), 50.0);
        assert_eq!(w.static_bytes(), 30.0 * 12.0);
    }

    #[test]
    fn bad_files_name_line_and_field() {
        for (text, want) in [
            (
                TWO.replace("params=30", "params=31"),
                "two line 1, field `params`: 31 declared, but the layers hold 30",
            ),
            (
                TWO.replace("flops=5", "flops=five"),
                "two line 3, field `flops`: \"five\" is not a number",
            ),
            (
                TWO.replace("train dataset_samples=100", "train dataset_samples=0"),
                "two line 2, field `dataset_samples`: 0 is below 1",
            ),
            (
                TWO.replace("layer name=b", "layr name=b"),
                "two line 3, field `layr`: unknown line",
            ),
            (
                TWO.replace("name=b ", "nom=b "),
                "two line 3, field `name`: is missing",
            ),
            (
                TWO.replace("train dataset_samples=100\n", ""),
                "two: train: no `train",
            ),
            (
                format!("{TWO}measured device=v100 batch=4 samples_per_s=0\n"),
                "two line 5, field `samples_per_s`: 0 is not a finite number > 0",
            ),
        ] {
            let e = Workload::parse("two", &text).expect_err(want).to_string();
            assert!(e.starts_with(want), "{e}");
        }
    }

    #[test]
    fn measured_speeds_fit_a_line() {
        let mut w = Workload::parse("two", TWO).expect("parses");
        let m = |batch, samples_per_s| Measured {
            device: "x".into(),
            batch,
            samples_per_s,
            line: 0,
        };
        // t(16) = 0.1 s, t(32) = 0.15 s: a = 1/320, c = 0.05.
        w.measured = vec![m(16, 160.0), m(32, 32.0 / 0.15)];
        let f = w.measured_fit("x").expect("fit");
        assert!(
            (f.a - 0.05 / 16.0).abs() < 1e-12 && (f.c - 0.05).abs() < 1e-12,
            "{f:?}"
        );
        // One point: through the origin.
        w.measured = vec![m(10, 100.0)];
        assert_eq!(w.measured_fit("x"), Some(Linear { a: 0.01, c: 0.0 }));
        assert_eq!(w.measured_fit("y"), None);
        // A negative intercept is not a real device: fit through the origin.
        w.measured = vec![m(1, 1.0), m(2, 2.0 / 3.0)];
        let f = w.measured_fit("x").expect("fit");
        assert_eq!(f.c, 0.0);
        assert!((f.a - 1.4).abs() < 1e-12, "{f:?}");
    }
}
