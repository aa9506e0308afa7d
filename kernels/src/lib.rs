//! Tandem's CPU compute engine.
//!
//! - [`gemm`]: a single-precision GEMM whose operands are addressed in place (strides or offset
//!   tables), with AVX-512 micro-kernels and fused bias/ReLU epilogues.
//! - [`pool`]: the fork-join thread pool a job's compute runs on.

pub mod gemm;
pub mod peak;
pub mod pool;
