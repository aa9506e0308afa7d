//! Knowing the limit: this machine's single-precision GEMM speed at the training step's shapes.
//!
//! [`measure`] times each shape of [`step_shapes`] (the MLP's and the LeNet CNN's GEMMs at batch 64,
//! in the orientation the engine calls them, plus square 512 and 1024 for reference) with the
//! engine's GEMM and, beside it, the `gemm` crate (candle's CPU matmul) and `matrixmultiply` when
//! built with the `references` feature, and Debian's OpenBLAS when its shared library is installed (loaded at run time, so nothing needs it
//! to build). [`theoretical`] reads the CPU's vector width, FMA and clock from `/proc/cpuinfo`, and
//! [`fma_peak`] measures what a register-only FMA loop reaches, which is the ceiling any GEMM can hit.
//!
//! All operands are row-major and contiguous here; the figure is the best of several timed runs
//! (the least disturbed by other load), in GFLOP/s = 2·m·n·k / seconds.

use std::time::Instant;

use crate::gemm::{Epilogue, MatA, MatB, gemm_parallel};
use crate::pool::Pool;

/// One GEMM shape `C[m×n] = A[m×k]·B[k×n]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    /// What it is in the training step.
    pub name: &'static str,
    /// Rows of C.
    pub m: usize,
    /// Columns of C (the engine's vector dimension).
    pub n: usize,
    /// Reduction length.
    pub k: usize,
}

impl Shape {
    /// Floating-point operations of one product.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// The training step's GEMMs (batch 64) as the engine calls them, then square references.
pub fn step_shapes() -> Vec<Shape> {
    let s = |name, m, n, k| Shape { name, m, n, k };
    vec![
        // MLP 784→256→128→10, activations feature-major: C = W·Xᵀ is [out × batch].
        s("mlp fc1 forward", 256, 64, 784),
        s("mlp fc1 weight-grad", 256, 784, 64),
        s("mlp fc2 forward", 128, 64, 256),
        s("mlp fc2 input-grad", 256, 64, 128),
        // LeNet CNN, NHWC: C is [pixels·batch × channels].
        s("cnn conv1 forward", 64 * 784, 16, 25),
        s("cnn conv2 forward", 64 * 196, 32, 400),
        s("cnn conv2 weight-grad", 400, 32, 64 * 196),
        s("cnn conv2 input-grad", 64 * 196, 16, 800),
        s("cnn fc1 forward", 128, 64, 1568),
        s("square 512", 512, 512, 512),
        s("square 1024", 1024, 1024, 1024),
    ]
}

/// One measurement.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GemmRecord {
    /// Which GEMM: `tandem`, `gemm-crate`, `matrixmultiply`, `openblas`.
    pub library: &'static str,
    /// The shape.
    #[serde(flatten)]
    pub shape: Shape,
    /// Threads used.
    pub threads: usize,
    /// Best time of one product, seconds.
    pub seconds: f64,
    /// 2·m·n·k / seconds / 1e9.
    pub gflops: f64,
}

/// Options of [`measure`].
#[derive(Clone, Debug)]
pub struct PeakOptions {
    /// Thread counts to measure.
    pub threads: Vec<usize>,
    /// Minimum time spent per (library, shape, threads), seconds.
    pub seconds: f64,
    /// Shapes (default [`step_shapes`]).
    pub shapes: Vec<Shape>,
    /// Also measure the reference libraries.
    pub references: bool,
}

impl Default for PeakOptions {
    fn default() -> Self {
        Self { threads: vec![1, 2], seconds: 0.3, shapes: step_shapes(), references: true }
    }
}

/// The CPU's theoretical single-precision peak, from `/proc/cpuinfo`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CpuPeak {
    /// `model name`.
    pub model: String,
    /// Clock in MHz as the kernel reports it (the base or TSC clock in a VM; turbo may be higher).
    pub mhz: f64,
    /// f32 lanes per vector (16 with AVX-512, 8 with AVX2).
    pub lanes: usize,
    /// Whether FMA is available (2 flops per lane per instruction).
    pub fma: bool,
    /// FMA units per core assumed (2 on Xeon Scalable with AVX-512).
    pub fma_units: usize,
    /// Cores (logical CPUs).
    pub cores: usize,
    /// lanes × 2 (FMA) × units × GHz, one core.
    pub gflops_per_core: f64,
}

/// Reads the theoretical peak of this CPU.
pub fn theoretical() -> CpuPeak {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let lanes = if has("avx512f") {
        16
    } else if has("avx2") || has("avx") {
        8
    } else {
        4
    };
    let fma = has("fma");
    let mhz: f64 = field("cpu MHz").parse().unwrap_or(0.0);
    let cores = info.lines().filter(|l| l.starts_with("processor")).count().max(1);
    let fma_units = 2;
    let gflops_per_core = lanes as f64 * if fma { 2.0 } else { 1.0 } * fma_units as f64 * mhz / 1e3;
    CpuPeak { model: field("model name"), mhz, lanes, fma, fma_units, cores, gflops_per_core }
}

/// GFLOP/s of a register-only FMA loop on one core (24 independent accumulators), the practical
/// ceiling of any GEMM here. Zero when the CPU lacks AVX-512.
pub fn fma_peak(seconds: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            let mut best = 0.0f64;
            let start = Instant::now();
            while start.elapsed().as_secs_f64() < seconds {
                let iters = 1_000_000u64;
                let t = Instant::now();
                // SAFETY: AVX-512F was detected above.
                let sink = unsafe { fma_loop(iters) };
                let dt = t.elapsed().as_secs_f64();
                std::hint::black_box(sink);
                best = best.max(iters as f64 * 24.0 * 32.0 / dt / 1e9);
            }
            return best;
        }
    }
    let _ = seconds;
    0.0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.0); 24];
    let a = _mm512_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm512_set1_ps(std::hint::black_box(1e-7));
    for _ in 0..std::hint::black_box(iters) {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let mut s = _mm512_setzero_ps();
    for v in acc {
        s = _mm512_add_ps(s, v);
    }
    _mm512_reduce_add_ps(s)
}

/// Times `f` (one product) until `seconds` have passed, at least 3 times; the best time.
fn best_time(seconds: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm caches and lazily started threads
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

/// Measures every shape with every library at every thread count.
pub fn measure(opts: &PeakOptions) -> Vec<GemmRecord> {
    let blas = if opts.references { openblas::Blas::load() } else { None };
    let mut out = Vec::new();
    for shape in &opts.shapes {
        let (m, n, k) = (shape.m, shape.n, shape.k);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 + 3) % 13) as f32 / 13.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 + 1) % 11) as f32 / 11.0 - 0.5).collect();
        let mut c = vec![0.0f32; m * n];
        for &threads in &opts.threads {
            let mut record = |library, seconds: f64| {
                out.push(GemmRecord {
                    library,
                    shape: shape.clone(),
                    threads,
                    seconds,
                    gflops: shape.flops() / seconds / 1e9,
                });
            };
            let pool = Pool::new(threads);
            let t = best_time(opts.seconds, || {
                let r = gemm_parallel(
                    &pool,
                    m,
                    n,
                    k,
                    MatA::row_major(&a, k),
                    MatB::row_major(&b, n),
                    &mut c,
                    n,
                    Epilogue::default(),
                );
                debug_assert!(r.is_ok());
            });
            record("tandem", t);
            if !opts.references {
                continue;
            }
            #[cfg(feature = "references")]
            crates::measure(opts.seconds, (m, n, k), (&a, &b, &mut c), threads, &mut record);
            if let Some(blas) = &blas {
                blas.set_threads(threads);
                let t = best_time(opts.seconds, || blas.sgemm(m, n, k, &a, &b, &mut c));
                record("openblas", t);
            }
        }
    }
    out
}

/// The reference GEMM crates (`--features references`): the `gemm` crate, which candle uses, and
/// `matrixmultiply`.
#[cfg(feature = "references")]
mod crates {
    use super::best_time;

    /// Times `C = A·B` (row-major, `m×k` by `k×n`) with each crate at `threads`.
    pub(super) fn measure(
        seconds: f64,
        (m, n, k): (usize, usize, usize),
        (a, b, c): (&[f32], &[f32], &mut [f32]),
        threads: usize,
        record: &mut impl FnMut(&'static str, f64),
    ) {
        let par = if threads == 1 { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(threads) };
        let t = best_time(seconds, || {
            // SAFETY: the pointers and strides describe the row-major m×k, k×n and m×n buffers,
            // whose lengths `super::measure` made so.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    k as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    par,
                )
            }
        });
        record("gemm-crate", t);
        if threads == 1 {
            // matrixmultiply sizes its threads from an environment variable once per process;
            // it is measured single-threaded only.
            let t = best_time(seconds, || {
                // SAFETY: as above.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        k as isize,
                        1,
                        b.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        c.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                }
            });
            record("matrixmultiply", t);
        }
    }
}

/// Whether Debian's OpenBLAS could be loaded (for the report).
pub fn openblas_available() -> bool {
    openblas::Blas::load().is_some()
}

/// Debian's OpenBLAS, loaded with `dlopen` so that nothing needs it at build time.
mod openblas {
    use std::ffi::{CStr, c_int, c_void};

    type Sgemm = unsafe extern "C" fn(
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        f32,
        *const f32,
        c_int,
        *const f32,
        c_int,
        f32,
        *mut f32,
        c_int,
    );
    type SetThreads = unsafe extern "C" fn(c_int);

    pub(super) struct Blas {
        sgemm: Sgemm,
        set_threads: Option<SetThreads>,
    }

    const ROW_MAJOR: c_int = 101;
    const NO_TRANS: c_int = 111;

    impl Blas {
        pub(super) fn load() -> Option<Self> {
            let names: [&CStr; 2] = [c"libopenblas.so.0", c"libopenblas.so"];
            for name in names {
                // SAFETY: dlopen/dlsym with NUL-terminated names; the handle is never closed, so
                // the function pointers stay valid for the process.
                unsafe {
                    let h = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                    if h.is_null() {
                        continue;
                    }
                    let s = libc::dlsym(h, c"cblas_sgemm".as_ptr());
                    if s.is_null() {
                        continue;
                    }
                    let t = libc::dlsym(h, c"openblas_set_num_threads".as_ptr());
                    let sgemm = std::mem::transmute::<*mut c_void, Sgemm>(s);
                    let set_threads =
                        (!t.is_null()).then(|| std::mem::transmute::<*mut c_void, SetThreads>(t));
                    return Some(Self { sgemm, set_threads });
                }
            }
            None
        }

        pub(super) fn set_threads(&self, n: usize) {
            if let Some(f) = self.set_threads {
                // SAFETY: OpenBLAS's documented setter.
                unsafe { f(n as c_int) };
            }
        }

        pub(super) fn sgemm(&self, m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
            // SAFETY: row-major contiguous buffers of the stated shapes.
            unsafe {
                (self.sgemm)(
                    ROW_MAJOR,
                    NO_TRANS,
                    NO_TRANS,
                    m as c_int,
                    n as c_int,
                    k as c_int,
                    1.0,
                    a.as_ptr(),
                    k as c_int,
                    b.as_ptr(),
                    n as c_int,
                    0.0,
                    c.as_mut_ptr(),
                    n as c_int,
                )
            }
        }
    }
}
