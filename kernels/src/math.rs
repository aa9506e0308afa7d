//! Elementwise functions written so that the compiler vectorises them (no libm calls, no
//! branches): `exp` by range reduction and a degree-6 polynomial (Cephes' `expf`, within 2 ulp on
//! the range that does not overflow), and GELU in GPT-2's tanh form with its derivative.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a part exact in f32 and the rest, so `x − k·ln2` loses nothing.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5·2²³: adding and subtracting it rounds to the nearest integer (ties to even).
const ROUND: f32 = 12_582_912.0;

/// `e^x` for any finite `x` (results below `e^-87.3` flush to a tiny normal, above `e^88.7` are
/// clamped to `e^88.7`); NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.3, 88.7);
    let k = (x * LOG2E + ROUND) - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^k by building the exponent bits (k is in [-126, 128] after the clamp, 128 only for the
    // clamped top, whose product is still finite: handled by splitting the scale in two).
    let ki = k as i32;
    let half = ki >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ki - half + 127) as u32) << 23);
    e * s1 * s2
}

/// √(2/π).
const GELU_A: f32 = 0.797_884_6;
const GELU_B: f32 = 0.044_715;

/// `tanh(u)` from `exp`: `1 − 2/(e^{2u} + 1)`.
#[inline(always)]
fn tanh(u: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * u) + 1.0)
}

/// GELU, tanh approximation (GPT-2's; PyTorch's `gelu(x, approximate="tanh")`).
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + tanh(GELU_A * (x + GELU_B * x * x * x)))
}

/// d gelu / dx.
#[inline(always)]
pub(crate) fn gelu_grad(x: f32) -> f32 {
    let t = tanh(GELU_A * (x + GELU_B * x * x * x));
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_A * (1.0 + 3.0 * GELU_B * x * x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-200.0) >= 0.0 && exp(-200.0) < 1e-37);
        assert!(exp(200.0).is_finite());
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn gelu_matches_its_definition_and_derivative() {
        for i in -800..800 {
            let x = i as f32 / 100.0;
            let xd = x as f64;
            let want = 0.5 * xd * (1.0 + (0.797_884_560_802_865_4 * (xd + 0.044715 * xd.powi(3))).tanh());
            assert!((gelu(x) as f64 - want).abs() < 1e-6 * want.abs().max(1.0), "gelu({x})");
            let h = 1e-3;
            let f = |v: f64| 0.5 * v * (1.0 + (0.797_884_560_802_865_4 * (v + 0.044715 * v.powi(3))).tanh());
            let fd = (f(xd + h) - f(xd - h)) / (2.0 * h);
            assert!((gelu_grad(x) as f64 - fd).abs() < 1e-5, "gelu'({x}): {} vs {fd}", gelu_grad(x));
        }
    }
}
