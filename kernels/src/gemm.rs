//! Single-precision GEMM for the engine: `C(m, n) (+)= Σ_k A(m, k) · B(k, n)`, then an epilogue
//! (bias per row or per column, ReLU), with no packing and no allocation.
//!
//! The operands are addressed the way the layers hold their data, so that neither a dense layer nor
//! a convolution has to copy anything into a GEMM format:
//! - `A(m, k) = a[rows(m) + cols(k)]`, where `rows` and `cols` are each a stride or a table of
//!   offsets ([`Index`]). A is read one element at a time and broadcast, so it may be scattered: a
//!   dense layer's weight matrix (strides), its transpose (strides swapped), or a convolution's
//!   input patches straight from the padded image (tables of pixel and tap offsets, the *indirect
//!   convolution* of Dukhan 2019 — im2col without the copy).
//! - `B(k, n) = b[rows(k) + n]`: rows of B are contiguous and read as 16-wide vectors.
//! - `C(m, n) = c[m · ldc + n]`, contiguous rows.
//!
//! The micro-kernel keeps an `MR × 16·NV` tile of C in 24 (or fewer) AVX-512 registers and runs
//! the k loop over one block of `KC` rows of B that stays in L1; the shape is picked from `n` (the
//! vector dimension). The last vector of a row is masked, so any `n` works without padding. Machines
//! without AVX-512 get a portable kernel (same results up to float rounding).
//!
//! Threads: [`gemm()`] runs on the calling thread; [`gemm_parallel`] splits the rows of C over a pool.

use crate::pool::{Pool, SharedMut, split};

/// Offsets of an operand's rows or columns.
#[derive(Clone, Copy, Debug)]
pub enum Index<'a> {
    /// Offset of index `i` is `i · stride`.
    Stride(usize),
    /// Offset of index `i` is `table[i]`.
    Table(&'a [usize]),
}

impl Index<'_> {
    /// Offset of index `i`.
    #[inline(always)]
    fn at(&self, i: usize) -> usize {
        match self {
            Index::Stride(s) => i * s,
            Index::Table(t) => t[i],
        }
    }

    /// Largest offset over `range`, or an error when a table is shorter than the range.
    fn max(&self, range: std::ops::Range<usize>) -> Result<usize, GemmError> {
        if range.is_empty() {
            return Ok(0);
        }
        match self {
            Index::Stride(s) => Ok((range.end - 1) * s),
            Index::Table(t) => t
                .get(range.clone())
                .and_then(|r| r.iter().copied().max())
                .ok_or(GemmError::Table { needed: range.end, got: t.len() }),
        }
    }
}

/// A's addressing: `A(m, k) = data[rows(m) + cols(k)]`.
#[derive(Clone, Copy, Debug)]
pub struct MatA<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Offset of row m.
    pub rows: Index<'a>,
    /// Offset of column k.
    pub cols: Index<'a>,
}

impl<'a> MatA<'a> {
    /// A row-major matrix with row stride `ld`.
    pub fn row_major(data: &'a [f32], ld: usize) -> Self {
        Self { data, rows: Index::Stride(ld), cols: Index::Stride(1) }
    }

    /// The transpose of a row-major matrix with row stride `ld` (`A(m, k) = data[k·ld + m]`).
    pub fn transposed(data: &'a [f32], ld: usize) -> Self {
        Self { data, rows: Index::Stride(1), cols: Index::Stride(ld) }
    }
}

/// B's addressing: `B(k, n) = data[rows(k) + n]`.
#[derive(Clone, Copy, Debug)]
pub struct MatB<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Offset of row k.
    pub rows: Index<'a>,
}

impl<'a> MatB<'a> {
    /// A row-major matrix with row stride `ld`.
    pub fn row_major(data: &'a [f32], ld: usize) -> Self {
        Self { data, rows: Index::Stride(ld) }
    }
}

/// What is added to the product before it is stored.
#[derive(Clone, Copy, Debug, Default)]
pub enum Bias<'a> {
    /// Nothing.
    #[default]
    None,
    /// `bias[m]` on row m.
    PerRow(&'a [f32]),
    /// `bias[n]` on column n.
    PerCol(&'a [f32]),
}

/// The epilogue: `C = relu?(A·B + (C if accumulate) + bias)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// Add to C's current values instead of overwriting them.
    pub accumulate: bool,
    /// Bias added after the product.
    pub bias: Bias<'a>,
    /// Apply max(0, ·) last.
    pub relu: bool,
}

/// A GEMM whose operands do not fit their buffers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GemmError {
    /// An operand would be read or written past its end.
    #[error("gemm {m}×{n}×{k}: operand {operand} needs {needed} values but has {got}")]
    Bounds {
        /// Which operand (A, B, C, bias).
        operand: &'static str,
        /// Shape.
        m: usize,
        /// Shape.
        n: usize,
        /// Shape.
        k: usize,
        /// Values the shape addresses.
        needed: usize,
        /// Values given.
        got: usize,
    },
    /// An offset table is shorter than the dimension it indexes.
    #[error("gemm offset table has {got} entries but the dimension needs {needed}")]
    Table {
        /// Entries needed.
        needed: usize,
        /// Entries given.
        got: usize,
    },
    /// `ldc` is smaller than `n`, so rows of C would overlap.
    #[error("gemm output row stride {ldc} is smaller than its width {n}")]
    Ldc {
        /// Row stride.
        ldc: usize,
        /// Width.
        n: usize,
    },
}

/// Which micro-kernel implementation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F intrinsics.
    Avx512,
    /// Portable Rust (whatever the compiler vectorises for the build target).
    Portable,
}

impl Isa {
    /// The best implementation this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
        }
        Isa::Portable
    }
}

/// `C[m·ldc + n] = epilogue(Σ_k A(m,k)·B(k,n))` for `m < m_dim`, `n < n_dim`, `k < k_dim`, on the
/// calling thread.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: MatB<'_>,
    c: &mut [f32],
    ldc: usize,
    epi: Epilogue<'_>,
) -> Result<(), GemmError> {
    gemm_with(Isa::detect(), m, n, k, a, b, c, ldc, epi)
}

/// [`gemm()`] with an explicit micro-kernel (tests compare the two).
#[allow(clippy::too_many_arguments)]
pub fn gemm_with(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: MatB<'_>,
    c: &mut [f32],
    ldc: usize,
    epi: Epilogue<'_>,
) -> Result<(), GemmError> {
    let isa = if isa == Isa::Avx512 && Isa::detect() != Isa::Avx512 { Isa::Portable } else { isa };
    check(m, n, k, &a, &b, c.len(), ldc, &epi)?;
    // SAFETY: `check` proved every address the shape reaches lies inside its buffer.
    unsafe { run_rows(isa, 0..m, n, k, &a, &b, c.as_mut_ptr(), ldc, &epi) };
    Ok(())
}

/// [`gemm()`] with the rows of C split over the pool's threads (each thread a contiguous block of
/// whole micro-tiles).
#[allow(clippy::too_many_arguments)]
pub fn gemm_parallel(
    pool: &Pool,
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: MatB<'_>,
    c: &mut [f32],
    ldc: usize,
    epi: Epilogue<'_>,
) -> Result<(), GemmError> {
    check(m, n, k, &a, &b, c.len(), ldc, &epi)?;
    let isa = Isa::detect();
    let threads = pool.threads();
    let mr = row_tile(n);
    let tiles = m.div_ceil(mr);
    if threads == 1 || tiles < 2 {
        // SAFETY: as in `gemm_with`.
        unsafe { run_rows(isa, 0..m, n, k, &a, &b, c.as_mut_ptr(), ldc, &epi) };
        return Ok(());
    }
    let out = SharedMut::new(c);
    pool.run(|tid| {
        let t = split(tiles, tid, threads);
        let rows = (t.start * mr)..(t.end * mr).min(m);
        if rows.is_empty() {
            return;
        }
        // SAFETY: bounds as in `gemm_with`; the row blocks of the threads are disjoint, so are the parts
        // of C they write (rows·ldc .. rows·ldc + n, with ldc ≥ n).
        unsafe { run_rows(isa, rows, n, k, &a, &b, out.as_ptr(), ldc, &epi) };
    });
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check(
    m: usize,
    n: usize,
    k: usize,
    a: &MatA<'_>,
    b: &MatB<'_>,
    c_len: usize,
    ldc: usize,
    epi: &Epilogue<'_>,
) -> Result<(), GemmError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let bounds = |operand, needed: usize, got| {
        if needed > got { Err(GemmError::Bounds { operand, m, n, k, needed, got }) } else { Ok(()) }
    };
    if ldc < n {
        return Err(GemmError::Ldc { ldc, n });
    }
    if k > 0 {
        let a_max = a.rows.max(0..m)? + a.cols.max(0..k)?;
        bounds("A", a_max + 1, a.data.len())?;
        let b_max = b.rows.max(0..k)? + n;
        bounds("B", b_max, b.data.len())?;
    }
    bounds("C", (m - 1) * ldc + n, c_len)?;
    match epi.bias {
        Bias::None => Ok(()),
        Bias::PerRow(v) => bounds("bias", m, v.len()),
        Bias::PerCol(v) => bounds("bias", n, v.len()),
    }
}

/// Rows of C per micro-tile for a C of width `n`: callers that split the rows of one product over
/// threads themselves split in multiples of it, so that no thread runs a partial tile in the middle.
pub fn row_tile(n: usize) -> usize {
    shape(n).0
}

/// Micro-tile shape `(MR, NV)` for a C of width `n`: as many accumulators as fit beside the B
/// vectors and broadcasts in 32 registers (LLVM hoists all of a k step's broadcasts, so 12×2 and
/// 8×3 spill), as few wasted lanes as the shapes allow.
fn shape(n: usize) -> (usize, usize) {
    match n {
        0..=16 => (12, 1),
        17..=32 => (8, 2),
        33..=48 => (6, 3),
        _ => (6, 4),
    }
}

/// Rows of B per block: one block of `KC × 16·NV` floats (24 KiB) stays in L1 across the m tiles.
fn kc(nv: usize) -> usize {
    384 / nv
}

/// Floats of C that one block of rows keeps in L2 across the k blocks (256 KiB).
const C_BLOCK_FLOATS: usize = 64 * 1024;

/// Rows of C per block (a multiple of `mr`): the k blocks run over one block of rows at a time,
/// so that its C stays in L2 instead of going to memory and back once per k block, at the cost of
/// reading B once per block of rows; all `m` rows when C is small enough to stay in L2 anyway or
/// when blocking costs more than it saves (a wide C: few rows fit; or a short k: few k blocks).
fn mc(mr: usize, n: usize, kc: usize, k: usize, m: usize) -> usize {
    let rows = (C_BLOCK_FLOATS / n.max(1)) / mr * mr;
    let passes = k.div_ceil(kc.max(1)).saturating_sub(1);
    // Per extra block of rows: B read again (k·n) against C's passes saved (2·rows·n each).
    if m * n <= 4 * C_BLOCK_FLOATS || rows == 0 || 2 * rows * passes <= k { m.max(1) } else { rows }
}

/// Runs rows `rows` of C.
///
/// # Safety
/// `check` must have succeeded for a shape covering `rows`, and `c` must be valid for the writes
/// of these rows.
#[allow(clippy::too_many_arguments)]
unsafe fn run_rows(
    isa: Isa,
    rows: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: &MatA<'_>,
    b: &MatB<'_>,
    c: *mut f32,
    ldc: usize,
    epi: &Epilogue<'_>,
) {
    if rows.is_empty() || n == 0 {
        return;
    }
    // SAFETY: forwarded.
    unsafe {
        match (a.cols, b.rows) {
            (Index::Stride(ac), Index::Stride(br)) => {
                dispatch(isa, rows, n, k, a, Stride(ac), b, Stride(br), c, ldc, epi)
            }
            (Index::Stride(ac), Index::Table(br)) => {
                dispatch(isa, rows, n, k, a, Stride(ac), b, Table(br), c, ldc, epi)
            }
            (Index::Table(ac), Index::Stride(br)) => {
                dispatch(isa, rows, n, k, a, Table(ac), b, Stride(br), c, ldc, epi)
            }
            (Index::Table(ac), Index::Table(br)) => {
                dispatch(isa, rows, n, k, a, Table(ac), b, Table(br), c, ldc, epi)
            }
        }
    }
}

/// An offset function for the k loop, monomorphised so the loop has no branch on the kind.
trait Off: Copy {
    /// Offset of index `i`; `i` is in bounds (checked by the driver).
    unsafe fn at(self, i: usize) -> usize;
}

#[derive(Clone, Copy)]
struct Stride(usize);
impl Off for Stride {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> usize {
        i * self.0
    }
}

#[derive(Clone, Copy)]
struct Table<'a>(&'a [usize]);
impl Off for Table<'_> {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> usize {
        // SAFETY: the driver checked the table covers the dimension.
        unsafe { *self.0.get_unchecked(i) }
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn dispatch<AC: Off, BR: Off>(
    isa: Isa,
    rows: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: &MatA<'_>,
    ac: AC,
    b: &MatB<'_>,
    br: BR,
    c: *mut f32,
    ldc: usize,
    epi: &Epilogue<'_>,
) {
    let (mr, nv) = shape(n);
    // SAFETY: forwarded.
    unsafe {
        match (isa, mr, nv) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, 12, 1) => {
                drive::<12, 1, _, _>(avx512::tile::<12, 1, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, 8, 2) => {
                drive::<8, 2, _, _>(avx512::tile::<8, 2, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, 6, 3) => {
                drive::<6, 3, _, _>(avx512::tile::<6, 3, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx512, _, _) => {
                drive::<6, 4, _, _>(avx512::tile::<6, 4, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            (_, 12, 1) => {
                drive::<12, 1, _, _>(portable::tile::<12, 1, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            (_, 8, 2) => {
                drive::<8, 2, _, _>(portable::tile::<8, 2, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            (_, 6, 3) => {
                drive::<6, 3, _, _>(portable::tile::<6, 3, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi)
            }
            _ => drive::<6, 4, _, _>(portable::tile::<6, 4, AC, BR>, rows, n, k, a, ac, b, br, c, ldc, epi),
        }
    }
}

/// One micro-tile call: the pieces of the GEMM a kernel needs.
#[derive(Clone, Copy)]
struct TileArgs<const MR: usize, AC, BR> {
    /// `A` pointers of the tile's rows (rows past the end repeat the first row).
    arows: [*const f32; MR],
    ac: AC,
    k0: usize,
    k1: usize,
    /// `B` at column n0.
    b: *const f32,
    br: BR,
    /// C at (m0, n0).
    c: *mut f32,
    ldc: usize,
    /// Valid rows of the tile.
    mrows: usize,
    /// Valid columns of the tile.
    ncols: usize,
    accumulate: bool,
    /// Bias of this block's rows (at m0) or columns (at n0); null for none.
    bias_row: *const f32,
    bias_col: *const f32,
    relu: bool,
}

type TileFn<const MR: usize, AC, BR> = unsafe fn(&TileArgs<MR, AC, BR>);

/// Loops over blocks of rows ([`mc`]), k blocks, n tiles and m tiles, calling the micro-kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn drive<const MR: usize, const NV: usize, AC: Off, BR: Off>(
    tile: TileFn<MR, AC, BR>,
    rows: std::ops::Range<usize>,
    n: usize,
    k: usize,
    a: &MatA<'_>,
    ac: AC,
    b: &MatB<'_>,
    br: BR,
    c: *mut f32,
    ldc: usize,
    epi: &Epilogue<'_>,
) {
    let nr = 16 * NV;
    let kc = kc(NV).max(1);
    let blocks = k.div_ceil(kc).max(1);
    let (bias_row, bias_col) = match epi.bias {
        Bias::None => (std::ptr::null(), std::ptr::null()),
        Bias::PerRow(v) => (v.as_ptr(), std::ptr::null()),
        Bias::PerCol(v) => (std::ptr::null(), v.as_ptr()),
    };
    let mc = mc(MR, n, kc, k, rows.len());
    let mut mb = rows.start;
    while mb < rows.end {
        let block_rows = mb..(mb + mc).min(rows.end);
        for blk in 0..blocks {
            let k0 = blk * kc;
            let k1 = (k0 + kc).min(k);
            let last = blk + 1 == blocks;
            let accumulate = epi.accumulate || blk > 0;
            let mut n0 = 0;
            while n0 < n {
                let ncols = nr.min(n - n0);
                let mut m0 = block_rows.start;
                while m0 < block_rows.end {
                    let mrows = MR.min(block_rows.end - m0);
                    // SAFETY: every offset formed here is within the bounds `check` validated.
                    unsafe {
                        let first = a.data.as_ptr().add(a.rows.at(m0));
                        let arows: [*const f32; MR] = std::array::from_fn(|r| {
                            if r < mrows { a.data.as_ptr().add(a.rows.at(m0 + r)) } else { first }
                        });
                        let args = TileArgs {
                            arows,
                            ac,
                            k0,
                            k1,
                            b: b.data.as_ptr().add(n0),
                            br,
                            c: c.add(m0 * ldc + n0),
                            ldc,
                            mrows,
                            ncols,
                            accumulate,
                            bias_row: if last && !bias_row.is_null() {
                                bias_row.add(m0)
                            } else {
                                std::ptr::null()
                            },
                            bias_col: if last && !bias_col.is_null() {
                                bias_col.add(n0)
                            } else {
                                std::ptr::null()
                            },
                            relu: last && epi.relu,
                        };
                        tile(&args);
                    }
                    m0 += MR;
                }
                n0 += nr;
            }
        }
        mb = block_rows.end;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Off, TileArgs};

    /// The AVX-512 micro-kernel: an `MR × 16·NV` tile of C in registers.
    ///
    /// # Safety
    /// AVX-512F must be present; the pointers of `t` must be valid for the tile (the driver's
    /// bounds check).
    #[target_feature(enable = "avx512f")]
    // Constant-bound index loops keep the accumulators in registers.
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn tile<const MR: usize, const NV: usize, AC: Off, BR: Off>(t: &TileArgs<MR, AC, BR>) {
        // Lanes of each vector that lie inside C's width.
        let masks: [__mmask16; NV] = std::array::from_fn(|j| {
            let valid = t.ncols.saturating_sub(16 * j).min(16);
            if valid == 16 { 0xFFFF } else { ((1u32 << valid) - 1) as __mmask16 }
        });
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        // SAFETY: addresses validated by the driver; masked lanes are not read.
        unsafe {
            for k in t.k0..t.k1 {
                let ao = t.ac.at(k);
                let bp = t.b.add(t.br.at(k));
                let bv: [__m512; NV] =
                    std::array::from_fn(|j| _mm512_maskz_loadu_ps(masks[j], bp.add(16 * j)));
                for r in 0..MR {
                    let x = _mm512_set1_ps(*t.arows[r].add(ao));
                    for j in 0..NV {
                        acc[r][j] = _mm512_fmadd_ps(x, bv[j], acc[r][j]);
                    }
                }
            }
            // The accumulators go to a stack tile once; the epilogue reads them from there. (An
            // epilogue that indexed `acc` by the runtime row count made LLVM keep `acc` in memory
            // and store every accumulator on every k step.)
            // Uninitialised: zeroing 3 KiB per tile cost a third of a short-k tile's time.
            let mut tile = std::mem::MaybeUninit::<[f32; 16 * 4 * 12]>::uninit();
            let tile_ptr = tile.as_mut_ptr().cast::<f32>();
            for (r, acc_r) in acc.iter().enumerate() {
                for (j, v) in acc_r.iter().enumerate() {
                    _mm512_storeu_ps(tile_ptr.add((r * NV + j) * 16), *v);
                }
            }
            let zero = _mm512_setzero_ps();
            for r in 0..t.mrows {
                let crow = t.c.add(r * t.ldc);
                let rb = if t.bias_row.is_null() { zero } else { _mm512_set1_ps(*t.bias_row.add(r)) };
                for (j, &mask) in masks.iter().enumerate() {
                    if mask == 0 {
                        continue;
                    }
                    let p = crow.add(16 * j);
                    let mut v = _mm512_loadu_ps(tile_ptr.add((r * NV + j) * 16));
                    if t.accumulate {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p));
                    }
                    if !t.bias_row.is_null() {
                        v = _mm512_add_ps(v, rb);
                    }
                    if !t.bias_col.is_null() {
                        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, t.bias_col.add(16 * j)));
                    }
                    if t.relu {
                        v = _mm512_max_ps(v, zero);
                    }
                    _mm512_mask_storeu_ps(p, mask, v);
                }
            }
        }
    }
}

mod portable {
    use super::{Off, TileArgs};

    /// The portable micro-kernel, same contract as the AVX-512 one.
    ///
    /// # Safety
    /// The pointers of `t` must be valid for the tile.
    #[allow(clippy::needless_range_loop)]
    pub(super) unsafe fn tile<const MR: usize, const NV: usize, AC: Off, BR: Off>(t: &TileArgs<MR, AC, BR>) {
        let w = t.ncols.min(16 * NV);
        let mut acc = [[0.0f32; 64]; MR];
        // SAFETY: addresses validated by the driver; only the `w` valid columns are read.
        unsafe {
            for k in t.k0..t.k1 {
                let ao = t.ac.at(k);
                let bp = t.b.add(t.br.at(k));
                let brow = std::slice::from_raw_parts(bp, w);
                for r in 0..MR {
                    let x = *t.arows[r].add(ao);
                    for (a, &bv) in acc[r][..w].iter_mut().zip(brow) {
                        *a += x * bv;
                    }
                }
            }
            for (r, acc_r) in acc.iter().enumerate().take(t.mrows) {
                let crow = std::slice::from_raw_parts_mut(t.c.add(r * t.ldc), w);
                for (j, (cv, &a)) in crow.iter_mut().zip(&acc_r[..w]).enumerate() {
                    let mut v = a;
                    if t.accumulate {
                        v += *cv;
                    }
                    if !t.bias_row.is_null() {
                        v += *t.bias_row.add(r);
                    }
                    if !t.bias_col.is_null() {
                        v += *t.bias_col.add(j);
                    }
                    if t.relu {
                        v = v.max(0.0);
                    }
                    *cv = v;
                }
            }
        }
    }
}
