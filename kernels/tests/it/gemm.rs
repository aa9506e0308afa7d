//! The GEMM against the naive triple loop: every micro-tile shape, odd sizes, strided, transposed
//! and table-addressed operands, accumulation, both bias kinds, ReLU, both micro-kernels and a pool,
//! and a product large enough to run in blocks of rows.

use crate::common::{Rand, assert_close};
use tandem_kernels::gemm::{Bias, Epilogue, Index, Isa, MatA, MatB, gemm_parallel, gemm_with};
use tandem_kernels::pool::Pool;

struct Case {
    m: usize,
    n: usize,
    k: usize,
}

fn naive(c: &Case, a: &dyn Fn(usize, usize) -> f32, b: &dyn Fn(usize, usize) -> f32) -> Vec<f32> {
    let mut out = vec![0.0; c.m * c.n];
    for i in 0..c.m {
        for j in 0..c.n {
            let mut s = 0.0f64;
            for p in 0..c.k {
                s += a(i, p) as f64 * b(p, j) as f64;
            }
            out[i * c.n + j] = s as f32;
        }
    }
    out
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (5, 7, 3),
    (13, 16, 9),
    (12, 17, 33),
    (25, 32, 400),
    (7, 40, 5),
    (64, 48, 100),
    (6, 64, 1000),
    (30, 100, 17),
    (3, 130, 0),
    // C too large for L2 and k longer than one block: the rows run in blocks of 1,020 (4 whole
    // blocks and a partial one ending in a partial micro-tile).
    (4099, 64, 200),
];

#[test]
fn row_major_matches_naive_on_both_kernels() {
    let mut rng = Rand::new(1);
    for &(m, n, k) in SHAPES {
        let case = Case { m, n, k };
        let a = rng.vec(m * k);
        let b = rng.vec(k * n);
        let want = naive(&case, &|i, p| a[i * k + p], &|p, j| b[p * n + j]);
        for isa in [Isa::Avx512, Isa::Portable] {
            let mut c = vec![f32::NAN; m * n];
            gemm_with(
                isa,
                m,
                n,
                k,
                MatA::row_major(&a, k),
                MatB::row_major(&b, n),
                &mut c,
                n,
                Epilogue::default(),
            )
            .unwrap();
            assert_close(&c, &want, 1e-5 * (k as f32).sqrt().max(1.0), &format!("{isa:?} {m}x{n}x{k}"));
        }
    }
}

#[test]
fn transposed_a_padded_ldc_accumulate_bias_relu() {
    let mut rng = Rand::new(2);
    for &(m, n, k) in SHAPES {
        let case = Case { m, n, k };
        let at = rng.vec(k * m + 3); // A stored transposed: A(i, p) = at[p·m + i]
        let b = rng.vec(k * (n + 2)); // B with row stride n + 2
        let ldc = n + 5;
        let c0 = rng.vec(m * ldc);
        let row_bias = rng.vec(m);
        let col_bias = rng.vec(n);
        let prod = naive(&case, &|i, p| at[p * m + i], &|p, j| b[p * (n + 2) + j]);
        for isa in [Isa::Avx512, Isa::Portable] {
            for (bias, relu) in [(Bias::PerRow(&row_bias), true), (Bias::PerCol(&col_bias), false)] {
                let mut c = c0.clone();
                let epi = Epilogue { accumulate: true, bias, relu };
                gemm_with(
                    isa,
                    m,
                    n,
                    k,
                    MatA::transposed(&at, m),
                    MatB::row_major(&b, n + 2),
                    &mut c,
                    ldc,
                    epi,
                )
                .unwrap();
                let mut want = c0.clone();
                for i in 0..m {
                    for j in 0..n {
                        let bv = match bias {
                            Bias::PerRow(v) => v[i],
                            Bias::PerCol(v) => v[j],
                            Bias::None => 0.0,
                        };
                        let v = c0[i * ldc + j] + prod[i * n + j] + bv;
                        want[i * ldc + j] = if relu { v.max(0.0) } else { v };
                    }
                }
                assert_close(&c, &want, 1e-5 * (k as f32).sqrt().max(1.0), &format!("{isa:?} {m}x{n}x{k}"));
            }
        }
    }
}

#[test]
fn table_addressed_operands() {
    let mut rng = Rand::new(3);
    for &(m, n, k) in SHAPES {
        let case = Case { m, n, k };
        let pool_a = rng.vec(4 * (m + k) + 8);
        let rows: Vec<usize> = (0..m).map(|_| rng.below(2 * m + 4)).collect();
        let cols: Vec<usize> = (0..k).map(|_| rng.below(2 * k + 4)).collect();
        let brow: Vec<usize> = (0..k).map(|_| rng.below(3 * k + 1) * n).collect();
        let bdata = rng.vec((3 * k + 2) * n);
        let want = naive(&case, &|i, p| pool_a[rows[i] + cols[p]], &|p, j| bdata[brow[p] + j]);
        for isa in [Isa::Avx512, Isa::Portable] {
            let a = MatA { data: &pool_a, rows: Index::Table(&rows), cols: Index::Table(&cols) };
            let b = MatB { data: &bdata, rows: Index::Table(&brow) };
            let mut c = vec![0.0; m * n];
            gemm_with(isa, m, n, k, a, b, &mut c, n, Epilogue::default()).unwrap();
            assert_close(&c, &want, 1e-5 * (k as f32).sqrt().max(1.0), &format!("{isa:?} {m}x{n}x{k}"));
        }
    }
}

#[test]
fn parallel_rows_match_single_thread() {
    let mut rng = Rand::new(4);
    for threads in [1, 2, 3] {
        let pool = Pool::new(threads);
        for &(m, n, k) in SHAPES {
            let a = rng.vec(m * k);
            let b = rng.vec(k * n);
            let mut one = vec![0.0; m * n];
            let mut par = vec![0.0; m * n];
            gemm_with(
                Isa::detect(),
                m,
                n,
                k,
                MatA::row_major(&a, k),
                MatB::row_major(&b, n),
                &mut one,
                n,
                Epilogue::default(),
            )
            .unwrap();
            gemm_parallel(
                &pool,
                m,
                n,
                k,
                MatA::row_major(&a, k),
                MatB::row_major(&b, n),
                &mut par,
                n,
                Epilogue::default(),
            )
            .unwrap();
            assert_eq!(
                one, par,
                "{threads} threads, {m}x{n}x{k}: a row's result must not depend on the split"
            );
        }
    }
}

#[test]
fn out_of_bounds_operands_are_errors() {
    let a = vec![0.0; 10];
    let b = vec![0.0; 10];
    let mut c = vec![0.0; 4];
    let mut call = |n: usize, k: usize, ldc: usize| {
        gemm_with(
            Isa::detect(),
            2,
            n,
            k,
            MatA::row_major(&a, k),
            MatB::row_major(&b, n),
            &mut c,
            ldc,
            Epilogue::default(),
        )
    };
    assert!(call(2, 5, 2).is_ok());
    let err = call(2, 6, 2).unwrap_err();
    assert!(err.to_string().contains("operand A"), "{err}");
    let err = call(3, 1, 3).unwrap_err();
    assert!(err.to_string().contains("operand C"), "{err}");
    let err = call(3, 1, 2).unwrap_err();
    assert!(err.to_string().contains("row stride"), "{err}");
}

#[test]
fn peak_tool_measures_every_library_and_reads_the_cpu() {
    use tandem_kernels::peak::{PeakOptions, Shape, measure, theoretical};
    let cpu = theoretical();
    assert!(cpu.lanes >= 4 && cpu.cores >= 1, "{cpu:?}");
    let opts = PeakOptions {
        threads: vec![1, 2],
        seconds: 0.01,
        shapes: vec![Shape { name: "small", m: 20, n: 30, k: 40 }],
        references: true,
    };
    let recs = measure(&opts);
    // The reference crates are measured only in a build with them (`--features references`, which
    // `make test` and `gemm-peak` have); the engine's library never links them.
    let libraries: &[&str] =
        if cfg!(feature = "references") { &["tandem", "gemm-crate"] } else { &["tandem"] };
    for lib in libraries {
        for t in [1, 2] {
            let r = recs
                .iter()
                .find(|r| r.library == *lib && r.threads == t)
                .unwrap_or_else(|| panic!("{lib} at {t} threads missing"));
            assert!(r.gflops > 0.0 && r.seconds > 0.0, "{r:?}");
        }
    }
    assert_eq!(
        recs.iter().any(|r| r.library == "matrixmultiply" && r.threads == 1),
        cfg!(feature = "references")
    );
}
