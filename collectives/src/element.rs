//! Rust element types that map onto wire dtypes.

use crate::op::DType;
use half::{bf16, f16};

/// A type collectives can move and reduce.
///
/// # Safety
/// `DTYPE.size()` must equal `size_of::<Self>()` and every bit pattern of that
/// size must be a valid value (the bytes come from other processes).
pub unsafe trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

// SAFETY: plain-old-data types of the stated sizes; all bit patterns valid.
unsafe impl Element for u8 {
    const DTYPE: DType = DType::U8;
}
// SAFETY: as above.
unsafe impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
// SAFETY: as above.
unsafe impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
// SAFETY: as above.
unsafe impl Element for f16 {
    const DTYPE: DType = DType::F16;
}
// SAFETY: as above.
unsafe impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
}
// SAFETY: as above.
unsafe impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
// SAFETY: as above.
unsafe impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
