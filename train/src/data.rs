//! The training data: an endless, epoch-free stream of synthetic
//! classification samples, labelled by a fixed random "teacher" network.
//!
//! Sample `k` is a pure function of `(seed, k)`: its inputs come from a
//! counter-based generator keyed by both, and its label is the argmax of the
//! teacher's output. So any rank can make any sample without reading a file
//! or talking to another rank, the ranks' shares of a global batch can move
//! between steps (the heterogeneity-aware planner does exactly that) without
//! changing which samples the global batch holds, and two runs with different
//! splits see bit-identical data.

/// SplitMix64: a small, well-mixed generator; stepping from a hashed key
/// makes a counter-based stream (no state shared between samples).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(key: u64) -> Rng {
        Rng { state: key }
    }

    /// A generator keyed by several words (seed, purpose, index, ...).
    pub fn keyed(words: &[u64]) -> Rng {
        let mut h = 0x243f_6a88_85a3_08d3u64;
        for &w in words {
            let mut r = Rng::new(h ^ w);
            h = r.next_u64();
        }
        Rng::new(h)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in the open interval (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller; one value per call, for simplicity).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// Purposes, so the teacher, the inputs and the student's initial weights
/// come from unrelated streams of the same seed.
const TEACHER: u64 = 1;
const INPUT: u64 = 2;
pub(crate) const INIT: u64 = 3;

/// Hidden width of the teacher network.
const TEACHER_HIDDEN: usize = 64;

/// The synthetic dataset: inputs in R^`inputs`, labels in 0..`classes`.
#[derive(Clone, Debug)]
pub struct Dataset {
    seed: u64,
    inputs: usize,
    classes: usize,
    /// Teacher: inputs → TEACHER_HIDDEN (tanh) → classes, row-major weights.
    w1: Vec<f64>,
    b1: Vec<f64>,
    w2: Vec<f64>,
}

impl Dataset {
    pub fn new(seed: u64, inputs: usize, classes: usize) -> Dataset {
        let mut r = Rng::keyed(&[seed, TEACHER]);
        let s1 = 1.0 / (inputs as f64).sqrt();
        let s2 = 1.0 / (TEACHER_HIDDEN as f64).sqrt();
        let w1 = (0..inputs * TEACHER_HIDDEN)
            .map(|_| 2.0 * s1 * r.normal())
            .collect();
        let b1 = (0..TEACHER_HIDDEN).map(|_| 0.5 * r.normal()).collect();
        let w2 = (0..TEACHER_HIDDEN * classes)
            .map(|_| 2.0 * s2 * r.normal())
            .collect();
        Dataset {
            seed,
            inputs,
            classes,
            w1,
            b1,
            w2,
        }
    }

    pub fn inputs(&self) -> usize {
        self.inputs
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Writes sample `k`'s inputs into `x` (length `inputs`) and returns its label.
    pub fn sample(&self, k: u64, x: &mut [f64]) -> usize {
        let mut r = Rng::keyed(&[self.seed, INPUT, k]);
        for v in x.iter_mut() {
            *v = r.normal();
        }
        let mut best = (0, f64::NEG_INFINITY);
        let mut h = [0.0f64; TEACHER_HIDDEN];
        for (j, hj) in h.iter_mut().enumerate() {
            let row = &self.w1[j * self.inputs..(j + 1) * self.inputs];
            let z: f64 = row.iter().zip(x.iter()).map(|(w, v)| w * v).sum();
            *hj = (z + self.b1[j]).tanh();
        }
        for c in 0..self.classes {
            let row = &self.w2[c * TEACHER_HIDDEN..(c + 1) * TEACHER_HIDDEN];
            let z: f64 = row.iter().zip(h.iter()).map(|(w, v)| w * v).sum();
            if z > best.1 {
                best = (c, z);
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_a_pure_function_of_seed_and_index() {
        let a = Dataset::new(7, 32, 10);
        let b = Dataset::new(7, 32, 10);
        let (mut x, mut y) = (vec![0.0; 32], vec![0.0; 32]);
        // Any order, any instance: the same sample.
        for k in [0u64, 5, 1 << 40, 3, 5] {
            let la = a.sample(k, &mut x);
            let lb = b.sample(k, &mut y);
            assert_eq!(la, lb);
            assert_eq!(
                x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
        // Different index or seed: different inputs.
        let x5 = {
            a.sample(5, &mut x);
            x.clone()
        };
        a.sample(6, &mut x);
        assert_ne!(x, x5);
        Dataset::new(8, 32, 10).sample(5, &mut x);
        assert_ne!(x, x5);
    }

    #[test]
    fn every_class_occurs() {
        let d = Dataset::new(1, 32, 10);
        let mut x = vec![0.0; 32];
        let mut counts = [0usize; 10];
        for k in 0..5000 {
            counts[d.sample(k, &mut x)] += 1;
        }
        // A random teacher is not balanced, but no class may be empty or dominate.
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert!(counts.iter().all(|&c| c < 2500), "{counts:?}");
    }
}
