//! Gradient buckets as PyTorch DDP forms them, and when each is ready.
//!
//! DDP walks the parameters in backward order and closes a bucket once it
//! holds at least the cap: 1 MiB for the first bucket (so communication
//! starts early) and `bucket_cap_mb` (25 MiB) after. A bucket is all-reduced
//! once the backward pass has produced its last gradient, and buckets are
//! all-reduced one after another on one stream, so a step's exposed
//! communication is how long the last bucket ends after the backward pass.

use crate::workload::Layer;

/// DDP's default cap of the first bucket.
pub const FIRST_BUCKET_BYTES: u64 = 1 << 20;
/// DDP's default `bucket_cap_mb`.
pub const BUCKET_BYTES: u64 = 25 << 20;

#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    pub bytes: u64,
    /// Share of the backward pass done when its last gradient is ready.
    pub ready_fraction: f64,
}

/// The buckets of `layers` (backward order) with `grad_bytes` per element.
/// Layers without parameters join no bucket, but their backward time still
/// counts towards when the next bucket is ready.
pub fn buckets(layers: &[Layer], grad_bytes: u64, first_cap: u64, cap: u64) -> Vec<Bucket> {
    let total: f64 = layers.iter().map(|l| l.backward_flops).sum();
    let total_params: f64 = layers.iter().map(|l| l.params as f64).sum();
    let mut out = Vec::new();
    let (mut bytes, mut done) = (0u64, 0.0f64);
    for (i, l) in layers.iter().enumerate() {
        // Without FLOP counts, backward time follows the parameter count.
        done += if total > 0.0 {
            l.backward_flops / total
        } else {
            l.params as f64 / total_params
        };
        bytes += l.params * grad_bytes;
        let limit = if out.is_empty() { first_cap } else { cap };
        if bytes > 0 && (bytes >= limit || i + 1 == layers.len()) {
            out.push(Bucket {
                bytes,
                ready_fraction: if i + 1 == layers.len() {
                    1.0
                } else {
                    done.min(1.0)
                },
            });
            bytes = 0;
        }
    }
    out
}

/// When each bucket's all-reduce ends, on one stream: bucket k starts once
/// it is ready and bucket k−1 has ended.
pub fn stream_ends(ready: &[f64], cost: &[f64]) -> Vec<f64> {
    let mut end = 0.0f64;
    ready
        .iter()
        .zip(cost)
        .map(|(&r, &c)| {
            end = end.max(r) + c;
            end
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(params: u64, backward_flops: f64) -> Layer {
        Layer {
            name: String::new(),
            params,
            forward_flops: backward_flops / 2.0,
            backward_flops,
        }
    }

    #[test]
    fn ddp_caps_close_buckets() {
        // 4-byte gradients: 0.5 MiB, 0.75 MiB, then 30 MiB alone, then 2 MiB.
        let l = [
            layer(1 << 17, 1.0),
            layer(3 << 16, 1.0),
            layer(30 << 18, 1.0),
            layer(1 << 19, 1.0),
        ];
        let b = buckets(&l, 4, FIRST_BUCKET_BYTES, BUCKET_BYTES);
        let bytes: Vec<u64> = b.iter().map(|b| b.bytes).collect();
        assert_eq!(bytes, [(5 << 20) / 4, 30 << 20, 2 << 20]);
        let ready: Vec<f64> = b.iter().map(|b| b.ready_fraction).collect();
        assert_eq!(ready, [0.5, 0.75, 1.0]);
    }

    #[test]
    fn two_layers_overlap_by_hand() {
        // Backward: layer 2 (output side) takes 2 ms, layer 1 takes 6 ms;
        // each bucket's all-reduce takes 3 ms. Bucket 2 is ready at 2 ms and
        // ends at 5 ms, under layer 1's backward; bucket 1 is ready at 8 ms
        // and ends at 11 ms: 3 ms of the 6 ms of communication are exposed.
        let l = [layer(1 << 18, 2.0), layer(1 << 18, 6.0)];
        let b = buckets(&l, 4, FIRST_BUCKET_BYTES, BUCKET_BYTES);
        assert_eq!(b.len(), 2);
        let backward = 8e-3;
        let ready: Vec<f64> = b.iter().map(|b| b.ready_fraction * backward).collect();
        assert_eq!(ready, [2e-3, 8e-3]);
        let ends = stream_ends(&ready, &[3e-3, 3e-3]);
        assert!((ends[0] - 5e-3).abs() < 1e-15 && (ends[1] - 11e-3).abs() < 1e-15);
        // A slow first all-reduce delays the second past its readiness.
        let ends = stream_ends(&ready, &[7e-3, 3e-3]);
        assert!((ends[1] - 12e-3).abs() < 1e-15, "{ends:?}");
    }
}
