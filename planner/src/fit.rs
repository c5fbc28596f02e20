//! Online fit of one rank's compute time against its local batch.
//!
//! The planner needs t(b) = a·b + c per rank, and ranks change: thermal
//! throttling, a noisy neighbour, a failing disk. The fit therefore forgets
//! (old steps lose weight by a factor λ per observation), shrugs off single
//! slow steps (a GC pause, a checkpoint) that would otherwise skew the
//! planner for dozens of steps, and still follows a rank that really became
//! slower. It is plain data, serializable, so the job server can keep it in
//! its database and resume after a restart.
//!
//! # Estimator
//!
//! Recursive least squares with forgetting factor λ computes, after every
//! observation, the weighted least-squares line with weights λ^age. For two
//! parameters that solution is kept here directly as exponentially weighted
//! means of b and t and their centred co-moments (West's weighted update),
//! which is the same estimate in a numerically stable recursive form and
//! makes the identifiability question (has b varied enough?) explicit.
//!
//! The fitted line is constrained to a ≥ 0, c ≥ 0, since the planner only
//! accepts such models: if the unconstrained line violates that, the best
//! line on either boundary (through the origin, or flat) is taken, which
//! for a convex quadratic is the constrained optimum.
//!
//! **Identifiability.** With one batch size, or with b varying so little
//! that the intercept's standard error (from the fit's own residuals)
//! exceeds 10% of the mean time, c
//! cannot be told apart from a: the fit is then the through-origin model
//! a = t̄/b̄, c = 0, which predicts the observed sizes exactly and makes the
//! planner split proportionally to speed until b varies. (Only zero-sample
//! steps seen: a = 0, c = t̄.)
//!
//! **Outliers.** Each new time is compared with the current fit's
//! prediction, relative to it (timing noise grows with the time). The
//! robust scale s is an exponentially weighted mean of these |residuals|
//! with each contribution clipped at the rejection threshold (a running
//! mean absolute deviation: one huge residual can only raise it by a
//! bounded factor), floored at 0.5% for timer jitter. Residuals beyond 5·s
//! (about 4σ for normal noise) are set aside and do not enter the fit.
//! If four set-aside residuals in a row fall on the same side, they are a
//! change, not noise: the fit restarts from those four, so a rank that
//! slows down 3× is followed within a few steps instead of being rejected
//! forever (or absorbed only as fast as forgetting allows). Set-aside
//! residuals raise the scale only once they prove isolated, so the run
//! that announces a change cannot inflate the threshold and hide it.
//!
//! **Bursts.** Four slow steps in a row are also what a passing burst looks
//! like (another process taking the core for a fraction of a second, a
//! checkpoint written over several steps). The fit restarted from the burst
//! then describes a rank that no longer exists, and the planner, which
//! moves work off the "slow" rank at once, hands it batch sizes the burst
//! never ran; forgetting would take dozens of steps to wash the burst out.
//! So the fit as it was before a restart is kept for [`PROBATION`] steps:
//! if [`RETURNED`] steps in a row fall within its limits and nearer its
//! prediction than the restarted fit's, the burst is over and the old fit
//! comes back (the burst stays counted as outliers). A rank that really
//! changed lands far from the old fit on every step, so it never returns.

use serde::{Deserialize, Serialize};

use crate::model::Linear;

/// Weight per step of the robust scale's running mean.
const SCALE_FORGET: f64 = 0.9;
/// Residuals beyond this many robust scales are outliers.
const REJECT: f64 = 5.0;
/// Floor of the robust scale (relative): timing jitter below which no
/// residual counts as an outlier, even on perfectly regular ranks.
const JITTER: f64 = 0.005;
/// Same-side outliers in a row that mean the rank itself changed.
const CONFIRM: usize = 4;
/// Scale weight (≈ residuals seen) before outliers are judged at all.
const WARM: f64 = 3.0;
/// Largest standard error of c, relative to the mean time, for which the
/// two-parameter fit is trusted.
const MAX_REL_SE: f64 = 0.1;
/// Steps after a restart during which the fit from before it may return.
const PROBATION: u32 = 2 * CONFIRM as u32;
/// Steps in a row that the fit from before a restart must explain better
/// than the restarted one for it to return.
const RETURNED: u32 = 2;
/// Online per-rank fit of compute time vs local batch: recursive least
/// squares with a forgetting factor, robust to outliers, serializable.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankFit {
    forget: f64,
    /// Σ λ^age over fitted observations.
    weight: f64,
    mean_b: f64,
    mean_t: f64,
    /// Weighted centred co-moments Σ w (x − x̄)(y − ȳ).
    m_bb: f64,
    m_bt: f64,
    m_tt: f64,
    /// Running sum and weight of clipped |residual| / prediction.
    scale_sum: f64,
    scale_weight: f64,
    seen: u64,
    outliers: u64,
    /// Consecutive same-side outliers, kept to be fitted if they turn out
    /// to be a change.
    suspects: Vec<Suspect>,
    /// The fit before the last restart, while the change may yet prove a
    /// burst (see the module comment). Absent in fits stored before it
    /// existed, as in fits past their probation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    before_restart: Option<Box<RankFit>>,
    /// Steps seen since the last restart, while `before_restart` is kept.
    #[serde(default)]
    since_restart: u32,
    /// Of those, the latest ones in a row that `before_restart` explained
    /// better than the current fit.
    #[serde(default)]
    returning: u32,
}

/// An observation set aside as an outlier, pending the verdict.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Suspect {
    batch: u64,
    seconds: f64,
    /// What it adds to the robust scale if it proves an isolated outlier.
    clipped: f64,
}

impl RankFit {
    /// A fit that discounts each older observation by `forget` (e.g. 0.95:
    /// roughly the last 20 steps count). Values outside [0.5, 1] are clamped
    /// (below 0.5 fewer than two steps would count); NaN means 1, no
    /// forgetting.
    pub fn new(forget: f64) -> RankFit {
        let forget = if forget.is_nan() {
            1.0
        } else {
            forget.clamp(0.5, 1.0)
        };
        RankFit {
            forget,
            weight: 0.0,
            mean_b: 0.0,
            mean_t: 0.0,
            m_bb: 0.0,
            m_bt: 0.0,
            m_tt: 0.0,
            scale_sum: 0.0,
            scale_weight: 0.0,
            seen: 0,
            outliers: 0,
            suspects: Vec::new(),
            before_restart: None,
            since_restart: 0,
            returning: 0,
        }
    }

    /// Records that a step with `batch` local samples took `seconds` of
    /// compute. Times that are NaN, infinite or negative cannot be real and
    /// are ignored (not counted).
    pub fn observe(&mut self, batch: u64, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        // Extreme but finite inputs (1e308 s) could still overflow the
        // moments; such an observation is dropped whole rather than leave a
        // fit that predicts NaN and cannot be stored.
        let before = self.clone();
        self.observe_finite(batch, seconds);
        if !self.is_finite() {
            *self = before;
        }
    }

    /// Whether every statistic is a finite number (always, after
    /// [`RankFit::observe`]; a fit decoded from storage may not be).
    pub fn is_finite(&self) -> bool {
        [
            self.weight,
            self.mean_b,
            self.mean_t,
            self.m_bb,
            self.m_bt,
            self.m_tt,
            self.scale_sum,
            self.scale_weight,
        ]
        .iter()
        .all(|x| x.is_finite())
            && self
                .suspects
                .iter()
                .all(|s| s.seconds.is_finite() && s.clipped.is_finite())
            && self
                .model()
                .is_none_or(|m| m.a.is_finite() && m.c.is_finite())
            && self.before_restart.as_ref().is_none_or(|b| b.is_finite())
    }

    fn observe_finite(&mut self, batch: u64, seconds: f64) {
        self.seen += 1;
        self.probation(batch, seconds);
        let Some(model) = self.model() else {
            self.fit(batch as f64, seconds);
            return;
        };
        let residual = model.relative_residual(batch, seconds);
        // Without a trusted slope, a new batch size's residual mixes in the
        // unknown intercept: it cannot be judged, and it must not move the
        // scale either.
        let judged = self.identifiable() || batch as f64 == self.mean_b;
        if !judged {
            self.settle_suspects();
            self.fit(batch as f64, seconds);
            return;
        }
        let limit = self.limit();
        let warm = self.scale_weight >= WARM;
        if warm && residual.abs() > limit {
            self.outliers += 1;
            // (The model cannot have moved since the last suspect: suspects
            // are not fitted.)
            let same_side = self
                .suspects
                .last()
                .is_none_or(|s| (s.seconds > model.time(s.batch)) == (residual > 0.0));
            if !same_side {
                self.settle_suspects();
            }
            self.suspects.push(Suspect {
                batch,
                seconds,
                clipped: limit,
            });
            if self.suspects.len() >= CONFIRM {
                self.restart();
            }
            return;
        }
        self.settle_suspects();
        // Clipped even while warming up (at 100%), so one wild early time
        // cannot make the scale infinite.
        self.record_scale(residual.abs().min(if warm { limit } else { 1.0 }));
        self.fit(batch as f64, seconds);
    }

    /// During the probation after a restart: brings the fit from before it
    /// back if the latest steps say the change was a burst that has ended,
    /// or lets it go once the probation is over.
    fn probation(&mut self, batch: u64, seconds: f64) {
        let Some(before) = self.before_restart.as_deref() else {
            return;
        };
        let old = before.relative_residual(batch, seconds);
        let new = self.relative_residual(batch, seconds);
        let explained = match (old, new) {
            (Some(old), Some(new)) => old.abs() <= before.limit() && old.abs() < new.abs(),
            _ => false,
        };
        self.returning = if explained { self.returning + 1 } else { 0 };
        self.since_restart += 1;
        if self.returning >= RETURNED {
            let Some(before) = self.before_restart.take() else {
                return;
            };
            let (seen, outliers) = (self.seen, self.outliers);
            *self = *before;
            self.seen = seen;
            self.outliers = outliers;
        } else if self.since_restart >= PROBATION {
            self.before_restart = None;
            self.since_restart = 0;
            self.returning = 0;
        }
    }

    /// (t − prediction) / prediction for a step of `batch` samples that
    /// took `seconds`; None before any observation.
    fn relative_residual(&self, batch: u64, seconds: f64) -> Option<f64> {
        Some(self.model()?.relative_residual(batch, seconds))
    }

    /// The relative residual beyond which a step is set aside.
    fn limit(&self) -> f64 {
        REJECT * self.scale().max(JITTER)
    }

    /// The current line. None before any observation. With only one distinct
    /// batch size (or too little spread to separate c from a, see the
    /// module comment), the through-origin model a = t̄/b̄, c = 0.
    pub fn model(&self) -> Option<Linear> {
        if self.weight <= 0.0 {
            return None;
        }
        if !self.identifiable() {
            return Some(if self.mean_b > 0.0 {
                Linear {
                    a: self.mean_t / self.mean_b,
                    c: 0.0,
                }
            } else {
                Linear {
                    a: 0.0,
                    c: self.mean_t,
                }
            });
        }
        let a = self.m_bt / self.m_bb;
        let c = self.mean_t - a * self.mean_b;
        if a >= 0.0 && c >= 0.0 {
            return Some(Linear { a, c });
        }
        // Constrained optimum: the better of the best line through the
        // origin and the best flat line.
        let e_bt = self.m_bt / self.weight + self.mean_b * self.mean_t;
        let e_bb = self.m_bb / self.weight + self.mean_b * self.mean_b;
        let origin = Linear {
            a: (e_bt / e_bb).max(0.0),
            c: 0.0,
        };
        let flat = Linear {
            a: 0.0,
            c: self.mean_t.max(0.0),
        };
        Some(if self.sse(&origin) <= self.sse(&flat) {
            origin
        } else {
            flat
        })
    }

    /// Observations recorded (valid times, including those set aside as
    /// outliers).
    pub fn observations(&self) -> u64 {
        self.seen
    }

    /// Observations set aside as outliers so far.
    pub fn outliers(&self) -> u64 {
        self.outliers
    }

    /// The forgetting factor in use.
    pub fn forget(&self) -> f64 {
        self.forget
    }

    /// Adds one observation to the weighted statistics.
    fn fit(&mut self, b: f64, t: f64) {
        let old = self.forget * self.weight;
        self.weight = old + 1.0;
        let db = b - self.mean_b;
        let dt = t - self.mean_t;
        self.mean_b += db / self.weight;
        self.mean_t += dt / self.weight;
        let share = old / self.weight;
        self.m_bb = self.forget * self.m_bb + share * db * db;
        self.m_bt = self.forget * self.m_bt + share * db * dt;
        self.m_tt = self.forget * self.m_tt + share * dt * dt;
    }

    fn record_scale(&mut self, abs_residual: f64) {
        self.scale_sum = SCALE_FORGET * self.scale_sum + abs_residual;
        self.scale_weight = SCALE_FORGET * self.scale_weight + 1.0;
    }

    /// Running mean relative absolute residual (0 before any).
    fn scale(&self) -> f64 {
        if self.scale_weight > 0.0 {
            self.scale_sum / self.scale_weight
        } else {
            0.0
        }
    }

    /// Whether c can be told apart from a: b has varied, and the
    /// intercept's standard error σ·√(1/W + b̄²/M_bb) is under 10% of the
    /// mean time, with σ from the fit's own weighted residuals (floored at
    /// the timer jitter, so two exact points are trusted).
    fn identifiable(&self) -> bool {
        if !(self.m_bb > 0.0 && self.weight > 0.0) {
            return false;
        }
        let rss = (self.m_tt - self.m_bt * self.m_bt / self.m_bb).max(0.0);
        let dof = (self.weight - 2.0).max(1.0);
        let sd = (rss / dof).sqrt().max(JITTER * self.mean_t);
        let se_c = sd * (1.0 / self.weight + self.mean_b * self.mean_b / self.m_bb).sqrt();
        se_c <= MAX_REL_SE * self.mean_t
    }

    /// Weighted mean squared error of a line, from the centred moments.
    fn sse(&self, m: &Linear) -> f64 {
        let w = self.weight;
        let bias = self.mean_t - m.a * self.mean_b - m.c;
        (self.m_tt - 2.0 * m.a * self.m_bt + m.a * m.a * self.m_bb) / w + bias * bias
    }

    /// The pending suspects were isolated outliers after all: they count
    /// towards the robust scale (clipped), so that noise which really is
    /// wider raises the threshold. Done only now, so that the run of
    /// outliers that announces a change does not inflate the scale and
    /// swallow the change before it is confirmed.
    fn settle_suspects(&mut self) {
        for s in std::mem::take(&mut self.suspects) {
            self.record_scale(s.clipped);
        }
    }

    /// The suspects were a change of the rank, not noise: what was learnt
    /// about the old rank no longer applies, so the fit starts again from
    /// the suspects. So does the robust scale: a fit from four points
    /// extrapolates poorly, and judging the next steps against the old
    /// noise level would set them aside and restart again and again.
    /// The fit as it was before the suspects is kept for the probation;
    /// a restart within a probation keeps the fit from before the first,
    /// which is the one learnt over many steps.
    fn restart(&mut self) {
        if self.before_restart.is_none() {
            let mut before = self.clone();
            before.suspects.clear();
            self.before_restart = Some(Box::new(before));
        }
        self.since_restart = 0;
        self.returning = 0;
        self.scale_sum = 0.0;
        self.scale_weight = 0.0;
        self.weight = 0.0;
        self.mean_b = 0.0;
        self.mean_t = 0.0;
        self.m_bb = 0.0;
        self.m_bt = 0.0;
        self.m_tt = 0.0;
        for s in std::mem::take(&mut self.suspects) {
            self.fit(s.batch as f64, s.seconds);
        }
    }
}
