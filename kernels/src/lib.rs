//! Tandem's CPU compute engine: the training step of a network as a few GEMMs and fused
//! elementwise passes over flat vectors, with no autograd graph, no allocation in the steady
//! state and no copy of parameters or gradients between formats.
//!
//! - [`gemm`]: single-precision GEMM whose operands are addressed in place (strides or offset
//!   tables), AVX-512 micro-kernels, fused bias/ReLU epilogues.
//! - [`pool`]: the fork-join thread pool of a job (none at all with one thread).
//! - [`layers`]: dense, convolution (any kernel, stride, padding), max/average/global pooling,
//!   batch norm, ReLU, flatten, fused softmax cross-entropy.
//! - [`net`]: a network of layers over one flat parameter vector, one flat gradient vector and one
//!   flat state vector owned by the caller.
//! - [`models`]: the trainer's MLP and LeNet-style CNN on the engine.
//! - [`peak`]: this machine's GEMM peak at the training step's shapes.
//!
//! The crate depends on no async runtime and no tensor library.

pub mod gemm;
pub mod layers;
pub mod models;
pub mod net;
pub mod peak;
pub mod pool;
mod simd;
