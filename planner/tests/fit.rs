//! RankFit: exact recovery, noise, outliers, a rank that slows down, the
//! one-batch-size fallback, and surviving a trip through the database.

mod common;

use gw_planner::{Linear, RankFit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TRUE: Linear = Linear { a: 1e-3, c: 0.05 };
const SIZES: [u64; 6] = [16, 32, 64, 96, 128, 256];

fn rel(x: f64, want: f64) -> f64 {
    ((x - want) / want).abs()
}

fn model(fit: &RankFit) -> Linear {
    fit.model().expect("observed")
}

#[test]
fn nothing_before_the_first_observation() {
    let fit = RankFit::new(0.95);
    assert_eq!(fit.model(), None);
    assert_eq!(fit.observations(), 0);
}

#[test]
fn noiseless_two_sizes_recover_a_and_c() {
    let mut fit = RankFit::new(0.95);
    for i in 0..10 {
        let b = if i % 2 == 0 { 32 } else { 64 };
        fit.observe(b, TRUE.time(b));
    }
    let m = model(&fit);
    assert!(rel(m.a, TRUE.a) < 1e-9 && rel(m.c, TRUE.c) < 1e-9, "{m:?}");
    assert_eq!(fit.observations(), 10);
    assert_eq!(fit.outliers(), 0);
}

#[test]
fn one_batch_size_gives_the_through_origin_model() {
    let mut fit = RankFit::new(0.95);
    fit.observe(64, 0.5);
    assert_eq!(
        fit.model(),
        Some(Linear {
            a: 0.5 / 64.0,
            c: 0.0
        })
    );
    for _ in 0..30 {
        fit.observe(64, 0.5);
    }
    assert_eq!(
        fit.model(),
        Some(Linear {
            a: 0.5 / 64.0,
            c: 0.0
        })
    );
    // Only empty steps: a constant.
    let mut fit = RankFit::new(0.95);
    fit.observe(0, 0.01);
    assert_eq!(fit.model(), Some(Linear { a: 0.0, c: 0.01 }));
}

#[test]
fn new_batch_sizes_after_a_steady_plan_are_learned_not_rejected() {
    // The server starts with an even plan (one size), then OptPerf moves
    // the rank: the new sizes disagree with the through-origin fallback
    // because of the intercept, and must be fitted, not set aside.
    let mut fit = RankFit::new(0.95);
    for _ in 0..40 {
        fit.observe(64, TRUE.time(64));
    }
    for i in 0..6 {
        let b = [40, 90][i % 2];
        fit.observe(b, TRUE.time(b));
    }
    let m = model(&fit);
    assert_eq!(fit.outliers(), 0);
    assert!(rel(m.a, TRUE.a) < 1e-6 && rel(m.c, TRUE.c) < 1e-6, "{m:?}");
}

fn noisy(rng: &mut StdRng, truth: &Linear, b: u64) -> f64 {
    truth.time(b) * (1.0 + 0.05 * common::normal(rng))
}

#[test]
fn five_percent_noise_is_averaged_out() {
    let mut rng = StdRng::seed_from_u64(11);
    // Long memory: the accuracy of the estimator itself.
    let mut fit = RankFit::new(0.999);
    for _ in 0..4000 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        fit.observe(b, noisy(&mut rng, &TRUE, b));
    }
    let m = model(&fit);
    assert!(rel(m.a, TRUE.a) < 0.02 && rel(m.c, TRUE.c) < 0.05, "{m:?}");

    // The usual short memory (about 20 steps): predictions over the range
    // within a few %.
    let mut fit = RankFit::new(0.95);
    for _ in 0..300 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        fit.observe(b, noisy(&mut rng, &TRUE, b));
    }
    let m = model(&fit);
    for b in SIZES {
        assert!(rel(m.time(b), TRUE.time(b)) < 0.08, "{m:?} at {b}");
    }
}

#[test]
fn ten_fold_outliers_barely_move_the_fit() {
    let mut rng = StdRng::seed_from_u64(5);
    let data: Vec<(u64, f64)> = (0..300)
        .map(|_| {
            let b = SIZES[rng.random_range(0..SIZES.len())];
            (b, noisy(&mut rng, &TRUE, b))
        })
        .collect();
    let mut clean = RankFit::new(0.95);
    let mut dirty = RankFit::new(0.95);
    for (i, &(b, t)) in data.iter().enumerate() {
        clean.observe(b, t);
        // A handful of 10× stragglers, one of them two steps in a row.
        let spoilt = matches!(i, 60 | 130 | 131 | 200 | 280 | 290);
        dirty.observe(b, if spoilt { 10.0 * t } else { t });
    }
    assert_eq!(dirty.outliers(), 6);
    let (c, d) = (model(&clean), model(&dirty));
    for b in SIZES {
        assert!(rel(d.time(b), c.time(b)) < 0.03, "{d:?} vs {c:?} at {b}");
        assert!(rel(d.time(b), TRUE.time(b)) < 0.05, "{d:?} at {b}");
    }
}

#[test]
fn a_rank_that_slows_down_is_followed() {
    let mut rng = StdRng::seed_from_u64(9);
    let mut fit = RankFit::new(0.95);
    for _ in 0..200 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        fit.observe(b, noisy(&mut rng, &TRUE, b));
    }
    let slow = Linear {
        a: 3.0 * TRUE.a,
        c: TRUE.c,
    };
    for _ in 0..20 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        fit.observe(b, noisy(&mut rng, &slow, b));
    }
    // The change is confirmed after four steps; the rest is the accuracy of
    // a fit from about 16 noisy steps.
    let m = model(&fit);
    assert!(rel(m.a, slow.a) < 0.15, "{m:?}");
    for b in SIZES {
        assert!(rel(m.time(b), slow.time(b)) < 0.15, "{m:?} at {b}");
    }
}

#[test]
fn invalid_times_are_ignored() {
    let mut fit = RankFit::new(0.95);
    for t in [f64::NAN, f64::INFINITY, -1.0] {
        fit.observe(32, t);
    }
    assert_eq!(fit.observations(), 0);
    assert_eq!(fit.model(), None);
    // Out-of-range forgetting factors are clamped, not trusted.
    assert_eq!(RankFit::new(7.0).forget(), 1.0);
    assert_eq!(RankFit::new(0.0).forget(), 0.5);
    assert_eq!(RankFit::new(f64::NAN).forget(), 1.0);
}

#[test]
fn serde_round_trip_predicts_identically() {
    let mut rng = StdRng::seed_from_u64(2);
    let mut fit = RankFit::new(0.95);
    for i in 0..150 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        let t = noisy(&mut rng, &TRUE, b);
        fit.observe(b, if i == 100 { 10.0 * t } else { t });
    }
    let json = serde_json::to_string(&fit).expect("serializes");
    let mut back: RankFit = serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back.model(), fit.model());
    // And the two keep agreeing, so the restored fit is the same state.
    for _ in 0..50 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        let t = noisy(&mut rng, &TRUE, b);
        fit.observe(b, t);
        back.observe(b, t);
        let (x, y) = (model(&fit), model(&back));
        assert_eq!(
            (x.a.to_bits(), x.c.to_bits()),
            (y.a.to_bits(), y.c.to_bits())
        );
    }
    assert_eq!(back.observations(), fit.observations());
}

/// The sequence that once left a fit whose JSON was `null`: a finite but
/// absurd time, then zero. Whatever finite times come, in any order and at
/// any batch size, the fit stays finite and survives the JSON round trip.
#[test]
fn extreme_finite_times_never_leave_a_non_finite_fit() {
    let mut fit = RankFit::new(0.95);
    fit.observe(32, 1e308);
    fit.observe(32, 0.0);
    assert!(fit.is_finite(), "{fit:?}");
    let json = serde_json::to_string(&fit).expect("serializes");
    assert!(!json.contains("null"), "{json}");
    let _: RankFit = serde_json::from_str(&json).expect("decodes");

    let extremes = [0.0, 5e-324, 1e-300, 1e-3, 1.0, 1e6, 1e150, 1e300, f64::MAX];
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..200 {
        let mut fit = RankFit::new(rng.random_range(0.5..=1.0));
        for _ in 0..rng.random_range(1..40) {
            let b = [0, 1, 32, 1 << 20, u64::MAX][rng.random_range(0..5)];
            fit.observe(b, extremes[rng.random_range(0..extremes.len())]);
            assert!(fit.is_finite(), "{fit:?}");
        }
        let json = serde_json::to_string(&fit).expect("serializes");
        let back: RankFit = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back.model(), fit.model());
    }
}

/// One rank's times with 1% noise: planned at `b`, it runs through a burst
/// of `burst` steps at twice its time (long enough to be confirmed as a
/// change), the planner meanwhile moving it to `after`, and then runs
/// normally at `after` again.
fn burst_then_normal(fit: &mut RankFit, rng: &mut StdRng, b: u64, after: u64, burst: usize) {
    let slow = Linear {
        a: 2.0 * TRUE.a,
        c: 2.0 * TRUE.c,
    };
    for i in 0..burst {
        let size = if i < 4 { b } else { after };
        fit.observe(size, slow.time(size) * (1.0 + 0.01 * common::normal(rng)));
    }
}

fn quiet_history(rng: &mut StdRng) -> RankFit {
    let mut fit = RankFit::new(0.95);
    for _ in 0..200 {
        let b = SIZES[rng.random_range(0..SIZES.len())];
        fit.observe(b, TRUE.time(b) * (1.0 + 0.01 * common::normal(rng)));
    }
    fit
}

/// The demo's case: a few steps of a rank slowed by another process are a
/// confirmed change when they end, and the planner has moved the rank to
/// a smaller batch. Two normal steps later the fit is the rank's own again
/// (without the fit from before the burst, the four burst steps stay in
/// the restarted fit and skew it for dozens of steps).
#[test]
fn a_burst_that_ends_gives_the_fit_back() {
    let mut rng = StdRng::seed_from_u64(21);
    let mut fit = quiet_history(&mut rng);
    burst_then_normal(&mut fit, &mut rng, 128, 64, 5);
    let during = model(&fit);
    assert!(
        rel(during.time(128), 2.0 * TRUE.time(128)) < 0.1,
        "{during:?}"
    );
    for _ in 0..2 {
        fit.observe(64, TRUE.time(64) * (1.0 + 0.01 * common::normal(&mut rng)));
    }
    let m = model(&fit);
    for b in SIZES {
        assert!(rel(m.time(b), TRUE.time(b)) < 0.03, "{m:?} at {b}");
    }
    // The four steps that confirmed the "change"; the fifth, at a size the
    // restarted fit could not judge yet, was fitted.
    assert_eq!(fit.outliers(), 4);
}

/// A change that lasts is kept: after the probation the fit from before it
/// is gone, and normal-looking steps then are judged as outliers of the
/// new rank instead of bringing the old one back.
#[test]
fn a_change_that_outlasts_the_probation_stays() {
    let mut rng = StdRng::seed_from_u64(22);
    let mut fit = quiet_history(&mut rng);
    burst_then_normal(&mut fit, &mut rng, 128, 64, 4 + 12);
    fit.observe(64, TRUE.time(64));
    fit.observe(64, TRUE.time(64));
    let m = model(&fit);
    assert!(rel(m.time(64), 2.0 * TRUE.time(64)) < 0.1, "{m:?}");
}

/// A fit stored mid-probation (the job server keeps fits in SQLite) comes
/// back in the same state, and one stored before probation existed (no
/// such fields in its JSON) still reads.
#[test]
fn a_fit_in_probation_survives_storage_and_old_fits_still_read() {
    let mut rng = StdRng::seed_from_u64(23);
    let mut fit = quiet_history(&mut rng);
    burst_then_normal(&mut fit, &mut rng, 128, 64, 5);
    let json = serde_json::to_string(&fit).expect("serializes");
    let mut back: RankFit = serde_json::from_str(&json).expect("deserializes");
    for _ in 0..2 {
        let t = TRUE.time(64);
        fit.observe(64, t);
        back.observe(64, t);
    }
    assert_eq!(back.model(), fit.model());
    assert!(rel(model(&back).time(64), TRUE.time(64)) < 0.03);

    let mut old: serde_json::Value = serde_json::from_str(&json).expect("json");
    let obj = old.as_object_mut().expect("an object");
    for k in ["before_restart", "since_restart", "returning"] {
        assert!(obj.remove(k).is_some(), "{k} is stored");
    }
    let old: RankFit = serde_json::from_value(old).expect("an old fit reads");
    assert!(old.model().is_some());
}
