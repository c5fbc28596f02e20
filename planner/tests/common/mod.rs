//! Helpers shared by the integration tests.

use rand::Rng;

/// A standard normal draw (Box–Muller), so the tests need no extra crate.
pub fn normal<R: Rng>(rng: &mut R) -> f64 {
    let u: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln stays finite
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}
