//! Runtime dispatch of the engine's elementwise loops to AVX-512 code.
//!
//! The crate is built for the baseline target (the images run on any x86-64), so loops the
//! compiler vectorises would only get SSE2. [`multiversion!`] defines a function twice — once
//! compiled with AVX-512 enabled, once for the baseline — and a dispatcher that picks the copy the
//! CPU runs.

/// Whether the CPU runs AVX-512F/BW/DQ/VL code (cached by the standard library).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `multiversion!(fn name(args) { body })`: `name` runs `body` compiled for AVX-512 when the CPU
/// has it, for the baseline target otherwise.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($a: $t),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn generic($($a: $t),*) $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
            #[allow(clippy::too_many_arguments)]
            unsafe fn wide($($a: $t),*) {
                generic($($a),*)
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::has_avx512() {
                // SAFETY: the CPU has the features `wide` is compiled for.
                return unsafe { wide($($a),*) };
            }
            generic($($a),*)
        }
    };
}
pub(crate) use multiversion;
