//! β as a function of message size.
//!
//! One β per link is a straight line through the origin of time against
//! bytes, but on a real host messages that stay in cache move several
//! times faster per byte than ones that stream through memory (on the
//! 2-core development VM: 3× at 1 MiB over shared memory). `gwbench
//! calibrate` therefore measures β at a few sizes; predictions interpolate
//! between them, linearly in β against log₂ size, and use the nearest end
//! outside the measured range.
//!
//! Calibration measures the curve with 2 ranks on one host, and what the
//! caches hold is every rank's buffers on the host, not one message's: an
//! all-reduce of s bytes among m ranks of a host touches about what one of
//! s·m/2 bytes among 2 does, so [`Curve::beta_for`] reads the curve there.
//! Without that, 4 ranks on this VM ran 16 MiB all-reduces 1.3-1.4× slower
//! than predicted over both transports in every round of two validation
//! runs (shm 2 MiB stays in the 2-rank knee, 64 MiB already streams), and
//! within 1.15 with it (docs/performance-model.md).

/// Up to [`Curve::MAX`] points `(bytes, β)`, sizes strictly increasing;
/// empty means "β does not depend on size".
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Curve {
    len: usize,
    pts: [(f64, f64); Curve::MAX],
}

impl Curve {
    pub const MAX: usize = 12;

    /// The curve through `points`, or why they cannot be one.
    pub fn new(points: &[(u64, f64)]) -> Result<Curve, String> {
        if points.len() > Self::MAX {
            return Err(format!("{} points, at most {}", points.len(), Self::MAX));
        }
        let mut c = Curve::default();
        for (i, &(bytes, beta)) in points.iter().enumerate() {
            if bytes == 0 || !beta.is_finite() || beta < 0.0 {
                return Err(format!(
                    "point {i} ({bytes} B, β {beta}) needs bytes > 0 and a finite β ≥ 0"
                ));
            }
            if i > 0 && bytes <= points[i - 1].0 {
                return Err(format!(
                    "point {i}: sizes must increase ({} then {bytes})",
                    points[i - 1].0
                ));
            }
            c.pts[i] = (bytes as f64, beta);
        }
        c.len = points.len();
        Ok(c)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The points as given.
    pub fn points(&self) -> Vec<(u64, f64)> {
        self.pts[..self.len]
            .iter()
            .map(|&(b, beta)| (b as u64, beta))
            .collect()
    }

    /// β for an all-reduce of `bytes` among `host_ranks` ranks per host
    /// (see the module comment); `base` when the curve is empty.
    pub fn beta_for(&self, base: f64, bytes: usize, host_ranks: usize) -> f64 {
        let footprint = bytes.saturating_mul(host_ranks.max(2)) / 2;
        self.beta_at(base, footprint)
    }

    /// β for a message of `bytes`; `base` when the curve is empty.
    pub fn beta_at(&self, base: f64, bytes: usize) -> f64 {
        let pts = &self.pts[..self.len];
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
            return base;
        };
        let s = bytes as f64;
        if s <= first.0 {
            return first.1;
        }
        if s >= last.0 {
            return last.1;
        }
        let i = pts.partition_point(|p| p.0 <= s);
        let (lo, hi) = (pts[i - 1], pts[i]);
        let f = (s.log2() - lo.0.log2()) / (hi.0.log2() - lo.0.log2());
        lo.1 + f * (hi.1 - lo.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolates_in_log_size_and_clamps_outside() {
        let c = Curve::new(&[(1 << 10, 1.0), (1 << 20, 3.0)]).expect("curve");
        assert_eq!(c.beta_at(9.0, 1 << 10), 1.0);
        assert_eq!(c.beta_at(9.0, 1), 1.0);
        assert_eq!(c.beta_at(9.0, 1 << 30), 3.0);
        // 2^15 is half way in log size.
        assert!((c.beta_at(9.0, 1 << 15) - 2.0).abs() < 1e-12);
        assert_eq!(Curve::default().beta_at(9.0, 1 << 15), 9.0);
        assert_eq!(c.points(), vec![(1 << 10, 1.0), (1 << 20, 3.0)]);
    }

    #[test]
    fn more_ranks_on_a_host_read_the_curve_at_their_footprint() {
        let c = Curve::new(&[(1 << 10, 1.0), (1 << 20, 3.0)]).expect("curve");
        // As calibrated: two ranks (or fewer, or unknown) read it as is.
        assert_eq!(c.beta_for(9.0, 1 << 15, 2), c.beta_at(9.0, 1 << 15));
        assert_eq!(c.beta_for(9.0, 1 << 15, 1), c.beta_at(9.0, 1 << 15));
        // Four ranks of 2^14 bytes hold what two of 2^15 do.
        assert!((c.beta_for(9.0, 1 << 14, 4) - 2.0).abs() < 1e-12);
        assert_eq!(c.beta_for(9.0, usize::MAX, 8), 3.0);
        assert_eq!(Curve::default().beta_for(9.0, 1 << 14, 4), 9.0);
    }

    #[test]
    fn bad_points_are_refused() {
        assert!(
            Curve::new(&[(10, 1.0), (10, 2.0)])
                .expect_err("equal")
                .contains("increase")
        );
        assert!(Curve::new(&[(0, 1.0)]).is_err());
        assert!(Curve::new(&[(1, f64::NAN)]).is_err());
        assert!(Curve::new(&[(1, -1.0)]).is_err());
        let many: Vec<(u64, f64)> = (1..=13).map(|i| (i, 1.0)).collect();
        assert!(Curve::new(&many).is_err());
    }
}
