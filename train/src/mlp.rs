//! A multi-layer perceptron with tanh hidden layers and a softmax
//! cross-entropy head, in plain f64 so that the training worker depends on no
//! ML framework and its arithmetic is fully determined by this file: two runs
//! that split a global batch differently must end with the same parameters to
//! rounding, which is only checkable when every operation is known.
//!
//! Parameters live in one flat vector (per layer: the weights, row-major
//! `out × in`, then the biases), so the gradient is one buffer and one
//! all-reduce. Per-sample forward/backward accumulates into a gradient buffer
//! of the same layout; the inner loops are dot products and axpys over
//! contiguous rows, which the compiler vectorises.

use crate::data::{INIT, Rng};

/// Layer sizes and where each layer's parameters start.
#[derive(Clone, Debug)]
pub struct Mlp {
    dims: Vec<usize>,
    /// Offset of layer l's weights in the flat vector; its biases follow them.
    offsets: Vec<usize>,
    len: usize,
}

/// Activations and deltas for one sample, reused across samples.
#[derive(Clone, Debug)]
pub struct Workspace {
    /// acts[0] is the input; acts[l] the output of layer l (tanh, or the softmax).
    acts: Vec<Vec<f64>>,
    delta: Vec<f64>,
    prev: Vec<f64>,
}

impl Mlp {
    /// `dims` = [inputs, hidden..., classes]; at least one layer.
    pub fn new(dims: &[usize]) -> Result<Mlp, String> {
        if dims.len() < 2 || dims.contains(&0) {
            return Err(format!(
                "layer sizes {dims:?}: need at least an input and an output size, all positive"
            ));
        }
        let mut offsets = Vec::with_capacity(dims.len() - 1);
        let mut len = 0usize;
        for w in dims.windows(2) {
            offsets.push(len);
            len = w[0]
                .checked_mul(w[1])
                .and_then(|m| m.checked_add(w[1]))
                .and_then(|m| m.checked_add(len))
                .ok_or_else(|| format!("layer sizes {dims:?} overflow"))?;
        }
        Ok(Mlp {
            dims: dims.to_vec(),
            offsets,
            len,
        })
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn inputs(&self) -> usize {
        self.dims[0]
    }

    pub fn classes(&self) -> usize {
        self.dims[self.dims.len() - 1]
    }

    /// Initial parameters: weights N(0, 1/fan_in), biases 0, from `seed`, so
    /// every rank starts from the same point without a broadcast.
    pub fn init(&self, seed: u64) -> Vec<f64> {
        let mut r = Rng::keyed(&[seed, INIT]);
        let mut p = vec![0.0; self.len];
        for (l, w) in self.dims.windows(2).enumerate() {
            let (n, m) = (w[0], w[1]);
            let s = 1.0 / (n as f64).sqrt();
            let o = self.offsets[l];
            for v in &mut p[o..o + n * m] {
                *v = s * r.normal();
            }
        }
        p
    }

    pub fn workspace(&self) -> Workspace {
        Workspace {
            acts: self.dims.iter().map(|&d| vec![0.0; d]).collect(),
            delta: vec![0.0; self.dims.iter().copied().max().unwrap_or(0)],
            prev: vec![0.0; self.dims.iter().copied().max().unwrap_or(0)],
        }
    }

    /// Forward pass on `x`; returns the cross-entropy loss of `label`. The
    /// class probabilities are left in the workspace.
    pub fn forward(&self, p: &[f64], x: &[f64], label: usize, ws: &mut Workspace) -> f64 {
        ws.acts[0].copy_from_slice(x);
        let layers = self.dims.len() - 1;
        for l in 0..layers {
            let (n, m) = (self.dims[l], self.dims[l + 1]);
            let o = self.offsets[l];
            let (w, b) = (&p[o..o + n * m], &p[o + n * m..o + n * m + m]);
            let (before, after) = ws.acts.split_at_mut(l + 1);
            let a = &before[l];
            let z = &mut after[0];
            for i in 0..m {
                z[i] = dot(&w[i * n..(i + 1) * n], a) + b[i];
            }
            if l + 1 < layers {
                for v in z.iter_mut() {
                    *v = v.tanh();
                }
            } else {
                softmax(z);
            }
        }
        let probs = &ws.acts[layers];
        -probs[label].max(f64::MIN_POSITIVE).ln()
    }

    /// Forward and backward on one sample: adds d loss / d p to `grad` and
    /// returns the loss.
    pub fn accumulate(
        &self,
        p: &[f64],
        x: &[f64],
        label: usize,
        grad: &mut [f64],
        ws: &mut Workspace,
    ) -> f64 {
        let loss = self.forward(p, x, label, ws);
        let layers = self.dims.len() - 1;
        // Softmax + cross-entropy: d loss / d z = p − onehot(label).
        let classes = self.classes();
        ws.delta[..classes].copy_from_slice(&ws.acts[layers]);
        ws.delta[label] -= 1.0;
        for l in (0..layers).rev() {
            let (n, m) = (self.dims[l], self.dims[l + 1]);
            let o = self.offsets[l];
            let a = &ws.acts[l];
            let delta = &ws.delta[..m];
            {
                let (gw, gb) = grad[o..o + n * m + m].split_at_mut(n * m);
                for i in 0..m {
                    axpy(delta[i], a, &mut gw[i * n..(i + 1) * n]);
                    gb[i] += delta[i];
                }
            }
            if l > 0 {
                // delta_prev = Wᵀ delta ⊙ tanh'(z_prev) = (Wᵀ delta) ⊙ (1 − a²).
                let w = &p[o..o + n * m];
                let prev = &mut ws.prev[..n];
                prev.fill(0.0);
                for i in 0..m {
                    axpy(delta[i], &w[i * n..(i + 1) * n], prev);
                }
                for (d, &av) in prev.iter_mut().zip(a.iter()) {
                    *d *= 1.0 - av * av;
                }
                ws.delta[..n].copy_from_slice(&ws.prev[..n]);
            }
        }
        loss
    }
}

/// Dot product with four independent accumulators (a fixed order, so the
/// result is deterministic, and one the compiler can vectorise).
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    let ca = a.chunks_exact(4);
    let cb = b.chunks_exact(4);
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut acc = [0.0f64; 4];
    for (x, y) in ca.zip(cb) {
        for k in 0..4 {
            acc[k] += x[k] * y[k];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// y += alpha · x.
pub fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += alpha * xv;
    }
}

fn softmax(z: &mut [f64]) {
    let max = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in z.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in z.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Rng;

    #[test]
    fn gradient_matches_finite_differences() {
        let m = Mlp::new(&[5, 7, 6, 3]).expect("dims");
        let mut p = m.init(3);
        // Non-zero biases, so their gradients are exercised too.
        let mut r = Rng::new(9);
        for v in p.iter_mut() {
            *v += 0.1 * r.normal();
        }
        let mut ws = m.workspace();
        let x: Vec<f64> = (0..5).map(|_| r.normal()).collect();
        for label in 0..3 {
            let mut g = vec![0.0; m.len()];
            m.accumulate(&p, &x, label, &mut g, &mut ws);
            let h = 1e-6;
            for i in 0..m.len() {
                let keep = p[i];
                p[i] = keep + h;
                let up = m.forward(&p, &x, label, &mut ws);
                p[i] = keep - h;
                let down = m.forward(&p, &x, label, &mut ws);
                p[i] = keep;
                let fd = (up - down) / (2.0 * h);
                let err = (fd - g[i]).abs() / fd.abs().max(g[i].abs()).max(1e-4);
                assert!(err < 1e-5, "param {i}: analytic {} vs numeric {fd}", g[i]);
            }
        }
    }

    #[test]
    fn gradient_accumulates_over_samples() {
        let m = Mlp::new(&[4, 8, 3]).expect("dims");
        let p = m.init(1);
        let mut ws = m.workspace();
        let xs = [[0.5, -1.0, 2.0, 0.1], [1.5, 0.2, -0.3, 0.9]];
        let mut both = vec![0.0; m.len()];
        let mut sep = vec![vec![0.0; m.len()]; 2];
        for (k, x) in xs.iter().enumerate() {
            m.accumulate(&p, x, k, &mut both, &mut ws);
            m.accumulate(&p, x, k, &mut sep[k], &mut ws);
        }
        for i in 0..m.len() {
            assert!((both[i] - (sep[0][i] + sep[1][i])).abs() < 1e-12);
        }
    }

    #[test]
    fn bad_dims_are_refused() {
        assert!(Mlp::new(&[4]).is_err());
        assert!(Mlp::new(&[4, 0, 3]).is_err());
        assert_eq!(Mlp::new(&[2, 3]).map(|m| m.len()).ok(), Some(9));
    }
}
