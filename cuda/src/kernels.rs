//! The reduction kernels as CUDA C++ source, one function per dtype and
//! operator, with the host path's exact semantics.
//!
//! A device all-reduce must give the same bits as the host path for the same
//! algorithm and rank order (see `gw_collectives::reduce`): one IEEE
//! operation per step in the element type, weights rounded to the compute
//! type and applied by one multiplication, avg as a true division by the
//! world size, min/max as `fminf`/`fmaxf` with ties returning the first
//! operand, f16/bf16 widened exactly to f32, combined there and rounded once
//! to nearest even (NaN quieted, its sign and upper payload kept), integers
//! wrapping. Three things make that hold on a GPU:
//!
//! - the 16-bit conversions are written here in integer arithmetic, not
//!   taken from `cuda_fp16.h`, so the same lines compile for the host too
//!   and are checked there bit for bit against the host kernels
//!   (`tests/host_bits.rs`), and no CUDA header is needed to build them;
//! - NVRTC runs with `--fmad=false` (a fused multiply-add would round once
//!   where the host rounds twice), `--ftz=false` and `--prec-div=true`
//!   (`nvrtc::OPTIONS`; `tests/nvrtc.rs` checks the PTX has no `fma`);
//! - integer arithmetic goes through unsigned types, where C++ defines
//!   wrapping.
//!
//! The source is one translation unit: a prelude, then per dtype × operator
//! an element function `gw_step_<dtype>_<op>` and a grid-stride kernel
//! `gw_reduce_<dtype>_<op>` (`dst[i] = post(op(sa(a[i]), sb(b[i])))`), and
//! per dtype `gw_copy_<dtype>` (`dst[i] = post(s(src[i]))`). Compiled for the
//! host (no `__CUDACC__`), the kernels become plain loops named
//! `gw_host_reduce_…` and `gw_host_copy_…`.

use std::fmt::Write;

/// Element types with device reductions (the host path's, less raw bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F64,
    F16,
    Bf16,
    I32,
    I64,
    U8,
}

/// Binary operators; avg is [`Op::Sum`] with the division step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
}

impl Elem {
    pub const ALL: [Elem; 7] = [
        Elem::F32,
        Elem::F64,
        Elem::F16,
        Elem::Bf16,
        Elem::I32,
        Elem::I64,
        Elem::U8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F64 => "f64",
            Elem::F16 => "f16",
            Elem::Bf16 => "bf16",
            Elem::I32 => "i32",
            Elem::I64 => "i64",
            Elem::U8 => "u8",
        }
    }

    /// The C type elements are stored as.
    fn storage(self) -> &'static str {
        match self {
            Elem::F32 => "float",
            Elem::F64 => "double",
            Elem::F16 | Elem::Bf16 => "gw_u16",
            Elem::I32 => "gw_i32",
            Elem::I64 => "gw_i64",
            Elem::U8 => "gw_u8",
        }
    }

    /// The C type the arithmetic runs in (weights and the divisor too).
    pub fn compute(self) -> &'static str {
        match self {
            Elem::F64 => "double",
            Elem::F32 | Elem::F16 | Elem::Bf16 => "float",
            Elem::I32 => "gw_u32",
            Elem::I64 => "gw_u64",
            Elem::U8 => "gw_u8",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F64 | Elem::F16 | Elem::Bf16)
    }

    pub fn size(self) -> usize {
        match self {
            Elem::U8 => 1,
            Elem::F16 | Elem::Bf16 => 2,
            Elem::F32 | Elem::I32 => 4,
            Elem::F64 | Elem::I64 => 8,
        }
    }

    /// Storage → compute, and back.
    fn load(self, x: &str) -> String {
        match self {
            Elem::F16 => format!("gw_f16_to_f32({x})"),
            Elem::Bf16 => format!("gw_bf16_to_f32({x})"),
            Elem::I32 => format!("(gw_u32)({x})"),
            Elem::I64 => format!("(gw_u64)({x})"),
            _ => x.to_string(),
        }
    }

    fn store(self, x: &str) -> String {
        match self {
            Elem::F16 => format!("gw_f32_to_f16({x})"),
            Elem::Bf16 => format!("gw_f32_to_bf16({x})"),
            Elem::I32 => format!("(gw_i32)({x})"),
            Elem::I64 => format!("(gw_i64)({x})"),
            _ => x.to_string(),
        }
    }
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Sum, Op::Prod, Op::Min, Op::Max];

    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Min => "min",
            Op::Max => "max",
        }
    }

    /// The expression combining compute values `x` and `y`.
    fn apply(self, e: Elem, x: &str, y: &str) -> String {
        let float = e.is_float();
        match self {
            // Unsigned, so that integers wrap as C++ defines it; u8 is
            // promoted to int and cut back.
            Op::Sum if e == Elem::U8 => format!("(gw_u8)({x} + {y})"),
            Op::Prod if e == Elem::U8 => format!("(gw_u8)({x} * {y})"),
            Op::Sum => format!("{x} + {y}"),
            Op::Prod => format!("{x} * {y}"),
            // fminf/fmaxf: a NaN operand is ignored unless both are; ties
            // (-0 against +0 too) keep the first.
            Op::Min if float => format!("(({y} < {x}) || ({x} != {x})) ? {y} : {x}"),
            Op::Max if float => format!("(({y} > {x}) || ({x} != {x})) ? {y} : {x}"),
            // Signed order for the signed types (compute is unsigned).
            Op::Min | Op::Max => {
                let cmp = if self == Op::Min { "<" } else { ">" };
                match e {
                    Elem::I32 => format!("((gw_i32){y} {cmp} (gw_i32){x}) ? {y} : {x}"),
                    Elem::I64 => format!("((gw_i64){y} {cmp} (gw_i64){x}) ? {y} : {x}"),
                    _ => format!("({y} {cmp} {x}) ? {y} : {x}"),
                }
            }
        }
    }
}

/// The prelude: portable integer types, the entry-point macros for device
/// and host, and the 16-bit float conversions.
const PRELUDE: &str = r#"// Generated by gw-cuda (cuda/src/kernels.rs); do not edit.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GW_DEVICE 1
#define GW_FN __device__ static __forceinline__
#define GW_RESTRICT __restrict__
#define GW_UNROLL _Pragma("unroll")
#else
#define GW_DEVICE 0
#define GW_FN static inline
#define GW_RESTRICT
#define GW_UNROLL
#endif
typedef unsigned char gw_u8;
typedef unsigned short gw_u16;
typedef unsigned int gw_u32;
typedef int gw_i32;
typedef unsigned long long gw_u64;
typedef long long gw_i64;

GW_FN gw_u32 gw_f32_bits(float x) { union { float f; gw_u32 u; } v; v.f = x; return v.u; }
GW_FN float gw_bits_f32(gw_u32 u) { union { float f; gw_u32 u; } v; v.u = u; return v.f; }

// bf16 is the upper half of an f32: widening is exact.
GW_FN float gw_bf16_to_f32(gw_u16 h) { return gw_bits_f32((gw_u32)h << 16); }

// Round to nearest even; a NaN keeps its sign and upper payload, quieted.
GW_FN gw_u16 gw_f32_to_bf16(float x) {
  gw_u32 b = gw_f32_bits(x);
  if (x != x) return (gw_u16)((b >> 16) | 0x40u);
  return (gw_u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

// Exact: normals, subnormals (renormalised), infinities and NaN payloads.
GW_FN float gw_f16_to_f32(gw_u16 h) {
  gw_u32 sign = ((gw_u32)h & 0x8000u) << 16;
  gw_u32 exp = ((gw_u32)h >> 10) & 0x1Fu;
  gw_u32 man = (gw_u32)h & 0x3FFu;
  if (exp == 0x1Fu) return gw_bits_f32(sign | 0x7F800000u | (man << 13));
  if (exp == 0u) {
    if (man == 0u) return gw_bits_f32(sign);
    gw_u32 e = 113u;  // 127 - 15 + 1
    while ((man & 0x400u) == 0u) { man <<= 1; e -= 1u; }
    return gw_bits_f32(sign | (e << 23) | ((man & 0x3FFu) << 13));
  }
  return gw_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even; overflow to infinity; NaN quieted with its sign
// and upper payload.
GW_FN gw_u16 gw_f32_to_f16(float x) {
  gw_u32 b = gw_f32_bits(x);
  gw_u32 sign = (b >> 16) & 0x8000u;
  gw_u32 exp = b & 0x7F800000u;
  gw_u32 man = b & 0x007FFFFFu;
  if (exp == 0x7F800000u) {
    gw_u32 nan = man != 0u ? 0x200u : 0u;
    return (gw_u16)(sign | 0x7C00u | nan | (man >> 13));
  }
  int half_exp = (int)(exp >> 23) - 127 + 15;
  if (half_exp >= 0x1F) return (gw_u16)(sign | 0x7C00u);
  if (half_exp <= 0) {
    if (14 - half_exp > 24) return (gw_u16)sign;
    man |= 0x00800000u;
    gw_u32 half_man = man >> (14 - half_exp);
    gw_u32 round_bit = 1u << (13 - half_exp);
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) half_man += 1u;
    return (gw_u16)(sign | half_man);
  }
  gw_u32 h = sign | ((gw_u32)half_exp << 10) | (man >> 13);
  gw_u32 round_bit = 0x00001000u;
  if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) h += 1u;
  return (gw_u16)h;
}
"#;

/// Inputs and outputs of one fan kernel at most: ranks sharing a GPU.
pub const MAX_FAN: usize = 16;

/// Every kernel's entry name, `gw_reduce_<dtype>_<op>`,
/// `gw_fan_<dtype>_<op>` and `gw_copy_<dtype>`.
pub fn entry_names() -> Vec<String> {
    let mut v = Vec::new();
    for e in Elem::ALL {
        for op in Op::ALL {
            v.push(reduce_name(e, op));
            v.push(fan_name(e, op));
        }
        v.push(copy_name(e));
    }
    v
}

/// `gw_fan_<dtype>_<op>`: every output gets the reduction of every input,
/// `((in0 ∘ in1) ∘ in2) …`, each step one `gw_step` (rounded to the
/// element type, as a chain of `gw_reduce` calls would store it), the last
/// one divided for avg.
pub fn fan_name(e: Elem, op: Op) -> String {
    format!("gw_fan_{}_{}", e.name(), op.name())
}

pub fn reduce_name(e: Elem, op: Op) -> String {
    format!("gw_reduce_{}_{}", e.name(), op.name())
}

pub fn copy_name(e: Elem) -> String {
    format!("gw_copy_{}", e.name())
}

/// The whole translation unit (see the module comment).
pub fn source() -> String {
    let mut s = String::from(PRELUDE);
    for e in Elem::ALL {
        let _ = write!(
            s,
            "\ntypedef struct {{ {st}* p[{MAX_FAN}]; }} gw_ptrs_{en};\n",
            st = e.storage(),
            en = e.name()
        );
        copy_fn(&mut s, e);
        for op in Op::ALL {
            reduce_fn(&mut s, e, op);
            fan_fn(&mut s, e, op);
        }
    }
    s
}

/// One thread reads every input's element before writing any output's,
/// so outputs may be inputs (every rank's all-reduce in place).
fn fan_fn(s: &mut String, e: Elem, op: Op) {
    let (st, ct, en, on) = (e.storage(), e.compute(), e.name(), op.name());
    let args = format!(
        "gw_ptrs_{en} outs, int nout, gw_ptrs_{en} ins, int nin, gw_u64 n, int fin, {ct} div"
    );
    // Loops over every slot, unrolled, with the counts as guards: indices
    // known at compile time keep the pointer arrays in the parameter space
    // (a run-time index copies both to local memory, 256 bytes a thread).
    let call = format!(
        "{st} acc = ins.p[0][i]; \
         GW_UNROLL for (int k = 1; k < {MAX_FAN}; ++k) {{ if (k < nin) acc = gw_step_{en}_{on}(acc, ins.p[k][i], 0, ({ct})0, 0, ({ct})0, fin && k == nin - 1, div); }} \
         if (nin == 1 && fin) acc = gw_copy1_{en}(acc, 0, ({ct})0, 1, div); \
         GW_UNROLL for (int k = 0; k < {MAX_FAN}; ++k) {{ if (k < nout) outs.p[k][i] = acc; }}"
    );
    kernel_pair(s, &fan_name(e, op), &args, &call);
}

/// The scaling, the operator and the final division of one element, as
/// the host kernels order them. Integer kernels take the same arguments
/// and ignore them (the host refuses weights and avg on integers).
fn reduce_fn(s: &mut String, e: Elem, op: Op) {
    let (st, ct, name) = (e.storage(), e.compute(), reduce_name(e, op));
    let (x, y) = (e.load("x"), e.load("y"));
    let body = if e.is_float() {
        let combined = op.apply(e, "p", "q");
        format!(
            "  {ct} p = {x};\n  {ct} q = {y};\n  if (wa) p = p * sa;\n  if (wb) q = q * sb;\n  \
             {ct} r = {combined};\n  if (fin) r = r / div;\n  return {};\n",
            e.store("r")
        )
    } else {
        let combined = op.apply(e, "p", "q");
        format!(
            "  (void)wa; (void)sa; (void)wb; (void)sb; (void)fin; (void)div;\n  \
             {ct} p = {x};\n  {ct} q = {y};\n  {ct} r = {combined};\n  return {};\n",
            e.store("r")
        )
    };
    let _ = write!(
        s,
        "\nGW_FN {st} gw_step_{en}_{on}({st} x, {st} y, int wa, {ct} sa, int wb, {ct} sb, int fin, {ct} div) {{\n{body}}}\n",
        en = e.name(),
        on = op.name()
    );
    let args = format!(
        "{st}* GW_RESTRICT dst, const {st}* a, const {st}* b, gw_u64 n, int wa, {ct} sa, int wb, {ct} sb, int fin, {ct} div"
    );
    let call = format!(
        "dst[i] = gw_step_{}_{}(a[i], b[i], wa, sa, wb, sb, fin, div);",
        e.name(),
        op.name()
    );
    kernel_pair(s, &name, &args, &call);
}

fn copy_fn(s: &mut String, e: Elem) {
    let (st, ct, name) = (e.storage(), e.compute(), copy_name(e));
    let x = e.load("x");
    let body = if e.is_float() {
        // A plain copy moves the bits (a 16-bit signalling NaN stays one).
        format!(
            "  if (!ws && !fin) return x;\n  {ct} r = {x};\n  if (ws) r = r * sc;\n  if (fin) r = r / div;\n  return {};\n",
            e.store("r")
        )
    } else {
        "  (void)ws; (void)sc; (void)fin; (void)div;\n  return x;\n".to_string()
    };
    let _ = write!(
        s,
        "\nGW_FN {st} gw_copy1_{en}({st} x, int ws, {ct} sc, int fin, {ct} div) {{\n{body}}}\n",
        en = e.name()
    );
    // `dst` may be `src` (in place), so neither is restrict.
    let args = format!("{st}* dst, const {st}* src, gw_u64 n, int ws, {ct} sc, int fin, {ct} div");
    let call = format!("dst[i] = gw_copy1_{}(src[i], ws, sc, fin, div);", e.name());
    kernel_pair(s, &name, &args, &call);
}

/// A grid-stride kernel on the device, a plain loop on the host. `dst` may
/// be exactly `a` or `b` (in place): each element is read before it is
/// written, by the same thread.
fn kernel_pair(s: &mut String, name: &str, args: &str, call: &str) {
    let host = name.replacen("gw_", "gw_host_", 1);
    let _ = write!(
        s,
        "#if GW_DEVICE\nextern \"C\" __global__ void {name}({args}) {{\n  \
         gw_u64 stride = (gw_u64)blockDim.x * gridDim.x;\n  \
         for (gw_u64 i = (gw_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{ {call} }}\n}}\n\
         #else\nextern \"C\" void {host}({args}) {{\n  for (gw_u64 i = 0; i < n; ++i) {{ {call} }}\n}}\n#endif\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_defined_once_for_the_device_and_once_for_the_host() {
        let src = source();
        for name in entry_names() {
            let device = format!("void {name}(");
            let host = format!("void {}(", name.replacen("gw_", "gw_host_", 1));
            assert_eq!(src.matches(&device).count(), 1, "{name}");
            assert_eq!(src.matches(&host).count(), 1, "{name} on the host");
        }
        assert_eq!(
            entry_names().len(),
            Elem::ALL.len() * (2 * Op::ALL.len() + 1)
        );
    }

    #[test]
    fn integers_compute_unsigned_and_floats_in_their_widened_type() {
        assert_eq!(Elem::I32.compute(), "gw_u32");
        assert_eq!(Elem::F16.compute(), "float");
        assert_eq!(Elem::Bf16.compute(), "float");
        assert_eq!(Elem::F64.compute(), "double");
        let src = source();
        assert!(src.contains("gw_step_i32_min"));
        // Signed order for a signed type held in unsigned arithmetic.
        assert!(src.contains("((gw_i32)q < (gw_i32)p) ? q : p"));
    }
}
