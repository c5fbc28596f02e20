//! Element slices over memory that may be unaligned for their type, and the
//! staging block size: what the element loops (`kernels`) and the 16-bit
//! float conversions (`narrow`) both build on, kept apart from both so that
//! neither imports the other for it.

/// One element behind a pointer that may be unaligned for `T`.
///
/// `repr(packed)` gives it alignment 1, so a `&[Un<T>]` can be built from any
/// non-null pointer; fields are only ever read and written by value (never
/// borrowed), which compiles to unaligned vector loads and stores.
#[derive(Clone, Copy)]
#[repr(C, packed)]
pub(crate) struct Un<T: Copy>(pub T);

/// Builds a shared slice of `n` (possibly unaligned) elements.
///
/// # Safety
/// `p` is non-null and valid for reads of `n * size_of::<T>()` bytes for `'a`,
/// and nothing writes them through another pointer meanwhile.
#[inline(always)]
pub(crate) unsafe fn un<'a, T: Copy>(p: *const u8, n: usize) -> &'a [Un<T>] {
    // SAFETY: `Un<T>` has alignment 1 and the size of `T`; the caller vouches
    // for validity and exclusivity of the range.
    unsafe { std::slice::from_raw_parts(p.cast::<Un<T>>(), n) }
}

/// Builds a mutable slice of `n` (possibly unaligned) elements.
///
/// # Safety
/// As [`un`], for writes, and no other reference to the range is used for `'a`.
#[inline(always)]
pub(crate) unsafe fn un_mut<'a, T: Copy>(p: *mut u8, n: usize) -> &'a mut [Un<T>] {
    // SAFETY: as in `un`; the caller guarantees exclusivity.
    unsafe { std::slice::from_raw_parts_mut(p.cast::<Un<T>>(), n) }
}

/// Elements per staging block: 1024 f32 = 4 KiB per operand, on the stack.
pub(crate) const BLOCK: usize = 1024;
